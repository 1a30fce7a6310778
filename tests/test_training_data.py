"""The per-step maze order: the plain per-epoch slices, and retries of split mazes."""

import pytest

from mazerl.training.data import record_success, retry_count, split_mazes, step_indices, step_mazes


def test_without_retries_a_step_is_its_own_slice_of_the_epoch_permutation():
    pool, per_step = 10, 4
    record = {index: 0.5 for index in range(pool)}  # every maze split: still no retries at share 0
    steps = [step_mazes(step, per_step, pool, 3, 0.0, record) for step in (1, 2)]
    assert steps == [(step_indices(1, per_step, pool, 3), 0), (step_indices(2, per_step, pool, 3), 0)]
    assert sorted(steps[0][0] + steps[1][0] + step_indices(3, per_step, pool, 3)[:2]) == list(range(pool))


def test_record_success_keeps_each_mazes_last_group_rate():
    record = {4: 1.0}
    record_success(record, [4, 7], [True, False, False, False, True, True, True, True], group_size=4)
    assert record == {4: 0.25, 7: 1.0}
    with pytest.raises(ValueError, match="7 episodes for 2 mazes x 4 samples"):
        record_success(record, [4, 7], [True] * 7, group_size=4)


def test_only_split_mazes_are_retried():
    assert split_mazes({1: 0.0, 2: 0.5, 3: 1.0, 5: 0.125}) == [2, 5]


def test_retries_replace_the_last_fresh_mazes_with_split_ones_never_twice():
    pool, per_step, seed = 64, 8, 0
    fresh = step_indices(5, per_step, pool, seed)
    split = [index for index in range(pool) if index not in fresh][:6]
    record = {index: 0.5 for index in split} | {fresh[0]: 0.5} | {index: 1.0 for index in range(40, 50)}
    mazes, retries = step_mazes(5, per_step, pool, seed, 0.5, record)
    assert retry_count(per_step, 0.5) == retries == 4
    assert mazes[:4] == fresh[:4], "the slice keeps its first entries"
    assert set(mazes[4:]) <= set(split), "a retry is a split maze outside the step's own slice"
    assert len(set(mazes)) == per_step, "a maze twice in a step would merge two groups into one"
    assert step_mazes(5, per_step, pool, seed, 0.5, dict(record)) == (mazes, retries), "a function of its inputs"
    assert step_mazes(6, per_step, pool, seed, 0.5, record)[0][4:] != mazes[4:], "another step, another draw"


def test_fewer_split_mazes_than_retry_slots_leave_fresh_mazes_in_the_rest():
    fresh = step_indices(1, 8, 64, 0)
    outside = next(index for index in range(64) if index not in fresh)
    mazes, retries = step_mazes(1, 8, 64, 0, 0.5, {outside: 0.25})
    assert retries == 1 and mazes == fresh[:7] + [outside]
    assert step_mazes(1, 8, 64, 0, 0.5, {}) == (fresh, 0)
