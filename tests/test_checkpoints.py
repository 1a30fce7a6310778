"""Checkpoint layout, atomic saves, the marker, pruning, and the fall-back past a damaged checkpoint."""

import re

import pytest
import torch
from safetensors.torch import save_file

from mazerl.training import checkpoints as ckpt

# The checkpoint layout the merge reads in the image, on its versions too (`make test-image-stack`).
pytestmark = pytest.mark.image_stack


def write_fake(step):
    """A small checkpoint whose every file loads: the adapter, the trainer state, the local backend's state."""

    def write(path):
        adapter = path / ckpt.ADAPTER_SUBDIR
        adapter.mkdir(parents=True)
        (adapter / "adapter_config.json").write_text("{}")
        save_file({"x.lora_A.weight": torch.full((4, 8), float(step))}, str(adapter / "adapter_model.safetensors"))
        ckpt.save_trainer_state(path, {"global_step": step})
        for name in ckpt.LOCAL_POLICY_FILES:
            torch.save({"state": {}}, path / name)

    return write


def test_save_then_latest_returns_the_marker_step(tmp_path):
    for step in (2, 4):
        ckpt.save(tmp_path, step, write_fake(step), keep=5)
    latest = ckpt.latest(tmp_path)
    assert latest.step == 4 and latest.path == tmp_path / "global_step_4"
    assert ckpt.load_trainer_state(latest) == {"global_step": 4}
    assert (tmp_path / ckpt.MARKER).read_text() == "4"


def test_no_marker_means_no_checkpoint_even_if_dirs_exist(tmp_path):
    write_fake(9)(tmp_path / "global_step_9")
    assert ckpt.latest(tmp_path) is None, "a directory is never picked by scanning"


def test_crash_while_writing_keeps_previous_checkpoint(tmp_path):
    ckpt.save(tmp_path, 1, write_fake(1), keep=3)

    def crash(path):
        (path / "trainer_state.pt").write_bytes(b"partial")
        raise KeyboardInterrupt("killed mid-write")

    with pytest.raises(KeyboardInterrupt):
        ckpt.save(tmp_path, 2, crash, keep=3)
    assert ckpt.latest(tmp_path).step == 1
    assert not (tmp_path / "global_step_2").exists()
    assert not list(tmp_path.glob(".*tmp*")), "temporary directory is cleaned up"


def test_incomplete_write_is_refused_before_the_marker_moves(tmp_path):
    ckpt.save(tmp_path, 1, write_fake(1), keep=3)
    with pytest.raises(ckpt.CheckpointError, match="adapter_model.safetensors"):
        ckpt.save(tmp_path, 2, lambda p: ckpt.save_trainer_state(p, {}), keep=3)
    assert ckpt.read_marker(tmp_path) == 1


def test_marker_pointing_at_incomplete_dir_is_an_error(tmp_path):
    (tmp_path / "global_step_3").mkdir()
    (tmp_path / ckpt.MARKER).write_text("3")
    with pytest.raises(ckpt.CheckpointError, match="incomplete"):
        ckpt.latest(tmp_path)


def test_malformed_marker_names_the_fix(tmp_path):
    (tmp_path / ckpt.MARKER).write_text("three")
    with pytest.raises(ckpt.CheckpointError, match="resumes from the newest intact checkpoint") as raised:
        ckpt.read_marker(tmp_path)
    assert "delete" not in str(raised.value), "never advise deleting a marker while intact steps may exist"


def test_stale_step_dir_left_by_crash_is_replaced(tmp_path):
    ckpt.save(tmp_path, 1, write_fake(1), keep=3)
    (tmp_path / "global_step_2").mkdir()  # renamed into place, marker never moved
    ckpt.save(tmp_path, 2, write_fake(2), keep=3)
    assert ckpt.latest(tmp_path).step == 2


def test_prune_keeps_the_newest_k(tmp_path):
    for step in range(1, 6):
        ckpt.save(tmp_path, step, write_fake(step), keep=2)
    assert sorted(p.name for p in tmp_path.glob("global_step_*")) == ["global_step_4", "global_step_5"]


class Arbitrary:
    """Any class: unpickling it could run code, so weights_only loading must refuse it."""


def test_trainer_state_refuses_arbitrary_pickles(tmp_path):
    ckpt.save(tmp_path, 1, write_fake(1), keep=1)
    torch.save({"obj": Arbitrary()}, tmp_path / "global_step_1" / ckpt.TRAINER_STATE)
    with pytest.raises(Exception, match="[Ww]eights only"):
        ckpt.load_trainer_state(ckpt.latest(tmp_path))


# --------------------------------------------------------------------------------------
# Resume: the newest intact checkpoint, past a damaged one
# --------------------------------------------------------------------------------------


def three_steps(root):
    for step in (1, 2, 3):
        ckpt.save(root, step, write_fake(step), keep=3)


def truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


DAMAGE = {
    "truncated adapter weights": (
        lambda root: truncate(root / "global_step_3" / ckpt.ADAPTER_SUBDIR / "adapter_model.safetensors"),
        "checkpoint step 3 is damaged: policy/lora_adapter/adapter_model.safetensors does not load",
    ),
    "truncated optimizer state": (
        lambda root: truncate(root / "global_step_3" / "policy" / "optimizer.pt"),
        "checkpoint step 3 is damaged: policy/optimizer.pt does not load",
    ),
    "trainer state of another step": (
        lambda root: ckpt.save_trainer_state(root / "global_step_3", {"global_step": 7}),
        "trainer_state.pt is of step 7",
    ),
    "marker naming a step that does not exist": (
        lambda root: (root / ckpt.MARKER).write_text("999"),
        "checkpoint step 999 is damaged: .*global_step_999 does not exist",
    ),
    "half-written (empty) marker": (lambda root: (root / ckpt.MARKER).write_text(""), "holds '', not a step number"),
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_a_damaged_latest_checkpoint_falls_back_to_the_newest_intact_step_saying_which_and_why(tmp_path, kind):
    damage, why = DAMAGE[kind]
    three_steps(tmp_path)
    damage(tmp_path)
    # Reading only, the resume point is the newest step whose every file loads, with the reason,
    point = ckpt.find_resume_point(tmp_path, ckpt.LOCAL_POLICY_FILES)
    expected = 3 if "marker" in kind else 2  # a damaged marker leaves every step intact
    assert point.checkpoint.step == expected and point.fell_back
    assert re.search(why, "; ".join(point.notes)), point.notes
    # and acting on it moves the damaged step aside, points the marker at the intact one and says so.
    lines = []
    resumed = ckpt.use_resume_point(tmp_path, ckpt.LOCAL_POLICY_FILES, lines.append)
    assert resumed.step == expected and ckpt.read_marker(tmp_path) == expected
    assert re.search(why, lines[0]) and f"resuming from step {expected}, the newest intact checkpoint" in lines[0]
    if expected == 2:
        assert (tmp_path / "global_step_3.damaged").is_dir() and not (tmp_path / "global_step_3").exists()
    assert ckpt.find_resume_point(tmp_path, ckpt.LOCAL_POLICY_FILES).notes == (), "the next resume finds it intact"
    ckpt.save(tmp_path, 3, write_fake(3), keep=3)  # training goes on past it
    assert ckpt.latest(tmp_path).step == 3


def test_an_intact_latest_checkpoint_is_used_as_it_is(tmp_path):
    three_steps(tmp_path)
    lines = []
    assert ckpt.use_resume_point(tmp_path, ckpt.LOCAL_POLICY_FILES, lines.append).step == 3
    assert lines == [] and ckpt.read_marker(tmp_path) == 3


def test_a_backend_without_the_local_state_files_is_checked_without_them(tmp_path):
    three_steps(tmp_path)
    (tmp_path / "global_step_3" / "policy" / "optimizer.pt").unlink()
    assert ckpt.find_resume_point(tmp_path).checkpoint.step == 3, "SkyRL's checkpoints carry no optimizer.pt there"
    assert ckpt.find_resume_point(tmp_path, ckpt.LOCAL_POLICY_FILES).checkpoint.step == 2


def test_no_intact_checkpoint_is_a_checkpoint_error_naming_each_damage_and_the_fix(tmp_path):
    three_steps(tmp_path)
    for step in (1, 2, 3):
        truncate(tmp_path / f"global_step_{step}" / ckpt.TRAINER_STATE)
    with pytest.raises(ckpt.CheckpointError, match=r"step 3 is damaged.*step 2 is damaged.*step 1 is damaged.*--fresh"):
        ckpt.find_resume_point(tmp_path, ckpt.LOCAL_POLICY_FILES)


def test_no_marker_is_no_resume_point(tmp_path):
    write_fake(9)(tmp_path / "global_step_9")
    assert ckpt.find_resume_point(tmp_path).checkpoint is None
