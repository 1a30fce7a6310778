"""The prompt path's memos: one per owner and name, bounded, least recently used out first, gone with the owner."""

import gc
import weakref

import numpy as np

from mazerl.policy.memo import memo_of


class Owner:
    """Stands for a processor or a model: any object that can be weakly referenced."""


def test_a_memo_is_one_per_owner_and_name_and_drops_the_least_recently_used_entry():
    a, b = Owner(), Owner()
    memo = memo_of(a, "ids", 2)
    assert memo_of(a, "ids", 2) is memo and memo_of(a, "other", 2) is not memo and memo_of(b, "ids", 2) is not memo
    memo["x"], memo["y"] = 1, 2
    assert memo.get("x") == 1  # x is now the more recently used
    memo["z"] = 3
    assert sorted(memo) == ["x", "z"], "y, the least recently used, went"


def test_a_memo_bounded_in_bytes_keeps_what_fits_and_goes_with_its_owner():
    owner = Owner()
    memo = memo_of(owner, "pixels", 1000, getsizeof=lambda value: value.nbytes)
    for key in range(4):
        memo[key] = np.zeros(100, dtype=np.float32)  # 400 bytes each: two fit
    assert sorted(memo) == [2, 3] and memo.currsize == 800
    gone = [False]

    weakref.finalize(memo, lambda: gone.__setitem__(0, True))
    del owner, memo
    gc.collect()
    assert gone[0], "the memo went with its owner"
