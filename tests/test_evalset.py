"""The versioned eval sets: digests, regeneration, ceilings stated in the README."""

import json
import shutil
from pathlib import Path

import pytest

from envs import evalset
from envs.evalset import EvalSetError, load, load_file
from envs.maze import Layout, optimal_moves

README = Path(__file__).parents[1] / "README.md"


def test_reference_set_is_seeds_0_to_63_of_9x9():
    s = load("maze64-easy-v1")
    assert len(s) == 64 and s.seeds == tuple(range(64))
    assert (s.size, s.cell_px, s.max_moves) == (9, 25, 15)
    assert all(layout == Layout.generate(seed, 9) for seed, layout in zip(s.seeds, s.layouts, strict=True))


def test_embedded_set_holds_256_distinct_7x7_mazes():
    s = load("maze256-small-v1")
    assert len(s) == 256 and len(set(s.layouts)) == 256
    assert (s.size, s.cell_px) == (7, 16)


def test_regeneration_is_byte_identical():
    assert evalset.main(["--check"]) == 0


def test_edited_file_fails_with_digest_error(tmp_path):
    path = tmp_path / "maze64-easy-v1.json"
    shutil.copy(evalset.path_for("maze64-easy-v1"), path)
    content = json.loads(path.read_text())
    content["layouts"][0]["agent"] = content["layouts"][0]["target"]
    path.write_text(json.dumps(content))
    with pytest.raises(EvalSetError, match="was edited"):
        load_file(path)


def test_unknown_name_lists_choices():
    with pytest.raises(EvalSetError, match="maze64-easy-v1"):
        load("maze65-easy-v1")


def test_digest_is_stable():
    s = load("maze64-easy-v1")
    assert s.digest == json.loads(evalset.path_for("maze64-easy-v1").read_text())["sha256"]
    assert s.digest == load("maze64-easy-v1").digest


def test_readme_states_the_ceiling_and_move_counts():
    # The README's numbers must be the ones the solver computes.
    text = README.read_text()
    for name in ("maze64-easy-v1", "maze256-small-v1"):
        s = load(name)
        moves = sorted(optimal_moves(layout) for layout in s.layouts)
        solvable = sum(m + 1 <= s.max_moves for m in moves)
        row = next((line for line in text.splitlines() if line.startswith(f"| `{name}`")), None)
        assert row is not None, f"README needs a table row for {name}"
        median = moves[len(moves) // 2 - 1] if len(moves) % 2 == 0 else moves[len(moves) // 2]
        expected = f"{moves[0]} / {median} / {moves[-1]}"
        assert expected in row, f"README row for {name} should give min/median/max {expected}"
        ceiling = f"{solvable}/{len(s)} ({100 * solvable / len(s):.1f}%)"
        assert ceiling in row, f"README row for {name} should give the ceiling {ceiling}"
    assert "ceiling at 15 turns" in text
