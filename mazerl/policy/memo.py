"""Bounded memos of pure functions, one per object they depend on (a processor, a model).

The prompt path recomputes the same few things turn after turn: a frame's preprocessed pixels,
a reply-free context's ids, a context layout's rope positions. Each is a pure function of its
key and of an object that does not change once loaded, so it is kept per such object (and goes
when the object goes), the most recently used first to stay, within a bound.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from cachetools import LRUCache

_MEMOS: weakref.WeakKeyDictionary[Any, dict[str, LRUCache]] = weakref.WeakKeyDictionary()


def memo_of(owner: Any, name: str, maxsize: int, getsizeof: Callable[[Any], int] | None = None) -> LRUCache:
    """``owner``'s LRU memo called ``name``, made on first use: ``maxsize`` entries, or, with
    ``getsizeof``, ``maxsize`` in the units it counts (bytes)."""
    memos = _MEMOS.setdefault(owner, {})
    memo = memos.get(name)
    if memo is None:
        memo = memos[name] = LRUCache(maxsize, getsizeof=getsizeof)
    return memo
