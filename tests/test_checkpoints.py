"""Checkpoint layout, atomic saves, the marker and pruning."""

import pytest
import torch

from mazerl.training import checkpoints as ckpt

# The checkpoint layout the merge reads in the image, on its versions too (`make test-image-stack`).
pytestmark = pytest.mark.image_stack


def write_fake(step):
    def write(path):
        adapter = path / ckpt.ADAPTER_SUBDIR
        adapter.mkdir(parents=True)
        (adapter / "adapter_config.json").write_text("{}")
        (adapter / "adapter_model.safetensors").write_bytes(b"x")
        ckpt.save_trainer_state(path, {"global_step": step})

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
    with pytest.raises(ckpt.CheckpointError, match="delete it"):
        ckpt.read_marker(tmp_path)


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
