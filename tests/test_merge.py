"""LoRA merge with proof, on the reduced starter model and real peft adapters in the checkpoint layout."""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from lora_adapters import make_adapter
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from mazerl.fingerprint import model_fingerprint
from mazerl.merge import proofs
from mazerl.merge.lora import MergeError, merge_adapter, merge_lora
from mazerl.policy.chat import model_inputs
from mazerl.policy.loader import load_policy
from mazerl.training import checkpoints

# The PEFT merge and transformers' save/load, on the versions the image ships too (`make test-image-stack`).
pytestmark = pytest.mark.image_stack

QUIET = {"log": lambda _: None}


def make_checkpoints(root: Path, step: int, adapter: Path, fingerprint: str, config: dict | None = None) -> Path:
    def write(path: Path) -> None:
        shutil.copytree(adapter, path / checkpoints.ADAPTER_SUBDIR)
        state = {"global_step": step, "base_model_fingerprint": fingerprint}
        checkpoints.save_trainer_state(path, state | ({"config": config} if config else {}))

    checkpoints.save(root, step, write, keep=2)
    return root


@pytest.fixture(scope="module")
def trained(starter_model_dir, tmp_path_factory):
    """A run's checkpoints directory whose marker names step 3, holding a LoRA adapter with non-zero deltas."""
    work = tmp_path_factory.mktemp("merge")
    adapter = make_adapter(starter_model_dir, work / "adapter")
    return make_checkpoints(work / "checkpoints", 3, adapter, model_fingerprint(starter_model_dir))


@pytest.fixture(scope="module")
def merged(starter_model_dir, trained, tmp_path_factory):
    out = tmp_path_factory.mktemp("merged-parent") / "merged"
    return out, merge_lora(starter_model_dir, trained, out, **QUIET)


def adapted_weight_keys(adapter_dir: Path) -> set[str]:
    """The base weights a LoRA adapter applies to, read from the adapter file itself."""
    with safe_open(str(adapter_dir / "adapter_model.safetensors"), framework="pt") as handle:
        return {
            key.removeprefix("base_model.model.").split(".lora_A.")[0] + ".weight"
            for key in handle.keys()  # noqa: SIM118
            if ".lora_A." in key
        }


def test_merged_weights_differ_from_base_exactly_where_lora_applies(starter_model_dir, trained, merged):
    out, report = merged
    base = load_file(str(starter_model_dir / "model.safetensors"))
    after = load_file(str(out / "model.safetensors"))
    assert set(base) == set(after), "the merged directory must hold the same tensors as the base"
    changed = {key for key in base if not torch.equal(base[key], after[key])}
    expected = adapted_weight_keys(checkpoints.latest(trained).adapter_dir)
    assert len(expected) == 12, "4 layers x (q_proj, v_proj, down_proj)"
    assert changed == expected, f"changed {sorted(changed - expected)} / unchanged {sorted(expected - changed)}"
    assert report.changed_tensors == 12 and report.lora_modules == 12 and not report.noop_adapter
    assert report.unchanged_tensors == len(base) - 12


def test_merged_model_reproduces_base_plus_adapter_logits(starter_model_dir, trained, merged):
    out, report = merged
    # an independent reference: the standard loader with the adapter left unmerged
    with_adapter = load_policy(starter_model_dir, adapter_dir=checkpoints.latest(trained).adapter_dir, device="cpu")
    reloaded = load_policy(out, device="cpu")
    ids, images = proofs.probe_contexts(with_adapter.processor)
    inputs = model_inputs(with_adapter.processor, ids, images)
    reference = proofs.probe_logits(with_adapter.model, inputs)
    got = proofs.probe_logits(reloaded.model, inputs)
    difference = float((got - reference).abs().max())
    assert difference <= 1e-4 * max(1.0, float(reference.abs().max())), f"logits differ by {difference}"
    assert report.adapter_effect > 100 * difference, "the adapter must change the logits far beyond the tolerance"
    assert report.logits_max_abs_diff <= report.logits_tolerance and report.reload_max_abs_diff == 0.0
    assert report.probe_tokens == inputs["attention_mask"].sum() and len(images[1]) == 2


def test_merged_directory_is_complete_and_recorded(starter_model_dir, trained, merged):
    out, report = merged
    names = {path.name for path in out.iterdir()}
    for required in (
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "preprocessor_config.json",
        "processor_config.json",
        "merge_record.json",
    ):
        assert required in names, f"{required} missing from the merged directory"
    # the starter's record comes along (the eval reads history_images from it), true of the merged weights
    from mazerl.starter.build import weights_digest
    from mazerl.starter.record import read_record

    base_record, merged_record = read_record(starter_model_dir), read_record(out)
    assert merged_record["config"] == base_record["config"]
    assert merged_record["base_weights_sha256"] == base_record["weights_sha256"]
    assert merged_record["weights_sha256"] == weights_digest(load_policy(out, device="cpu").model)
    assert merged_record["weights_sha256"] != base_record["weights_sha256"]
    assert merged_record["merged"]["checkpoint_step"] == 3
    assert (out / "chat_template.jinja").read_text() == (starter_model_dir / "chat_template.jinja").read_text()
    assert [p.name for p in out.parent.iterdir()] == ["merged"], "no temporary directory may be left behind"
    record = json.loads((out / "merge_record.json").read_text())
    assert record["checkpoint_step"] == 3 and record["adapter_dir"].endswith("global_step_3/policy/lora_adapter")
    assert record["base_fingerprint"] == model_fingerprint(starter_model_dir)


def test_vision_tower_adapters_are_merged_and_the_trained_context_mode_recorded(starter_model_dir, tmp_path):
    # Given an adapter where the trainer puts one with freeze_vision: false (language model + vision
    # tower and mergers), from a run that trained in another context mode than the starter's,
    from mazerl.starter.record import recorded_context_mode
    from mazerl.training.config import TrainConfig
    from mazerl.training.lora_adapter import lora_pattern

    config = TrainConfig(
        run_id="v", base_model=starter_model_dir, freeze_vision=False, history_images=1, history_text=0
    )
    adapter = make_adapter(starter_model_dir, tmp_path / "adapter", targets=lora_pattern(config))
    mode = {"history_images": 1, "history_text": 0}
    runs = make_checkpoints(tmp_path / "ckpt", 2, adapter, model_fingerprint(starter_model_dir), config=mode)
    # when it is merged,
    out = tmp_path / "merged"
    report = merge_lora(starter_model_dir, runs, out, **QUIET)
    # then the vision tower's weights changed exactly where its adapters were, the proofs held,
    base = load_file(str(starter_model_dir / "model.safetensors"))
    after = load_file(str(out / "model.safetensors"))
    changed = {key for key in base if not torch.equal(base[key], after[key])}
    expected = adapted_weight_keys(adapter)
    assert any("visual" in key for key in expected) and any("language_model" in key for key in expected)
    assert changed == expected and report.changed_tensors == len(expected)
    # and the merged model's own context mode is the one it was trained in, not the starter's
    assert recorded_context_mode(out) == (1, 0) != recorded_context_mode(starter_model_dir)


def test_repeated_merge_reuses_the_directory(starter_model_dir, trained, merged):
    out, first = merged
    weights_mtime = os.stat(out / "model.safetensors").st_mtime_ns
    again = merge_lora(starter_model_dir, trained, out, **QUIET)
    assert again.reused and not first.reused
    assert again.changed_tensors == first.changed_tensors
    assert os.stat(out / "model.safetensors").st_mtime_ns == weights_mtime, "a reused merge must not rewrite weights"


def test_zero_adapter_merges_to_the_base(starter_model_dir, tmp_path):
    adapter = make_adapter(starter_model_dir, tmp_path / "zero", scale=0.0)
    report = merge_adapter(starter_model_dir, adapter, tmp_path / "out", **QUIET)
    assert report.noop_adapter and report.changed_tensors == 0 and report.adapter_effect == 0.0
    base = load_file(str(starter_model_dir / "model.safetensors"))
    after = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert all(torch.equal(base[key], after[key]) for key in base)


def test_missing_adapter_names_the_marker_and_step(starter_model_dir, trained, tmp_path):
    with pytest.raises(MergeError, match="does not exist: the train stage wrote no checkpoint"):
        merge_lora(starter_model_dir, tmp_path / "nowhere", tmp_path / "out", **QUIET)
    (tmp_path / "empty").mkdir()
    with pytest.raises(MergeError, match="no checkpoint marker .*latest_ckpt_global_step.txt"):
        merge_lora(starter_model_dir, tmp_path / "empty", tmp_path / "out", **QUIET)
    broken = shutil.copytree(trained, tmp_path / "broken")
    (broken / "global_step_3" / "policy" / "lora_adapter" / "adapter_model.safetensors").unlink()
    with pytest.raises(MergeError, match=r"marker .* is unusable: .*global_step_3 is incomplete: .*adapter_model"):
        merge_lora(starter_model_dir, broken, tmp_path / "out", **QUIET)
    assert not (tmp_path / "out").exists()


def test_adapter_of_another_base_model_is_refused(starter_model_dir, trained, tmp_path):
    # the checkpoint records a different base-model fingerprint
    adapter = checkpoints.latest(trained).adapter_dir
    other = make_checkpoints(tmp_path / "other", 5, adapter, "f" * 64)
    with pytest.raises(MergeError, match=r"\(checkpoint step 5\) was trained on a base model with fingerprint ffff"):
        merge_lora(starter_model_dir, other, tmp_path / "out", **QUIET)
    # an adapter whose matrices do not fit the base's layers
    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    key = next(k for k in tensors if "q_proj.lora_A" in k)
    tensors[key] = torch.zeros(tensors[key].shape[0], tensors[key].shape[1] + 8)
    wrong = shutil.copytree(adapter, tmp_path / "wrong-shape")
    save_file(tensors, str(wrong / "adapter_model.safetensors"))
    with pytest.raises(MergeError, match="does not fit the base model: module .*q_proj.* has input size 128"):
        merge_adapter(starter_model_dir, wrong, tmp_path / "out", **QUIET)
    assert not (tmp_path / "out").exists()


def test_skyrl_checkpoint_is_checked_against_the_base_model_record_beside_it(starter_model_dir, trained, tmp_path):
    # given a checkpoint in SkyRL's shape (trainer_state.pt holds no fingerprint) and the record
    # skyrl_entry keeps beside the checkpoints, naming another base model,
    adapter = checkpoints.latest(trained).adapter_dir

    def write(path: Path) -> None:
        shutil.copytree(adapter, path / checkpoints.ADAPTER_SUBDIR)
        checkpoints.save_trainer_state(path, {"global_step": 4, "config": {"trainer": {}}})

    root = tmp_path / "skyrl-checkpoints"
    checkpoints.save(root, 4, write, keep=2)
    (root / checkpoints.BASE_MODEL_RECORD).write_text(json.dumps({"fingerprint": "e" * 64, "base_model": "/x"}))
    # when it is merged into the starter, then the merge refuses it before loading anything.
    with pytest.raises(MergeError, match=r"\(checkpoint step 4\) was trained on a base model with fingerprint eeee"):
        merge_lora(starter_model_dir, root, tmp_path / "out", **QUIET)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda text: text[:-5], "is not valid JSON"),
        (lambda text: json.dumps({**json.loads(text), "peft_type": "IA3"}), "peft_type is 'IA3', not 'LORA'"),
        (lambda text: json.dumps({**json.loads(text), "r": 0}), "r is 0, not a positive integer"),
        (lambda text: json.dumps({**json.loads(text), "target_modules": None}), "target_modules is empty"),
        (lambda text: "[]", "holds list, not a JSON object"),
    ],
)
def test_malformed_adapter_config_is_refused(starter_model_dir, trained, tmp_path, edit, message):
    adapter = shutil.copytree(checkpoints.latest(trained).adapter_dir, tmp_path / "adapter")
    config = adapter / "adapter_config.json"
    config.write_text(edit(config.read_text()))
    with pytest.raises(MergeError, match=message) as failure:
        merge_adapter(starter_model_dir, adapter, tmp_path / "out", **QUIET)
    assert "adapter_config.json" in str(failure.value)


def corrupting_merge(corrupt):
    from peft.tuners.lora import LoraModel

    original = LoraModel.merge_and_unload

    def merge_and_unload(self, *args, **kwargs):
        model = original(self, *args, **kwargs)
        corrupt(model)
        return model

    return merge_and_unload


def test_merge_that_touches_other_weights_fails_loudly(starter_model_dir, trained, tmp_path, monkeypatch):
    from peft.tuners.lora import LoraModel

    def nudge_embeddings(model):
        with torch.no_grad():
            model.get_input_embeddings().weight[0, 0] += 1e-3

    monkeypatch.setattr(LoraModel, "merge_and_unload", corrupting_merge(nudge_embeddings))
    with pytest.raises(MergeError, match="changed tensors that LoRA does not adapt: .*embed_tokens"):
        merge_lora(starter_model_dir, trained, tmp_path / "out", **QUIET)
    assert list(tmp_path.iterdir()) == [], "a failed merge leaves nothing behind"


def test_merge_that_drops_the_adapter_fails_loudly(starter_model_dir, trained, tmp_path, monkeypatch):
    from peft.tuners.lora import LoraModel

    monkeypatch.setattr(LoraModel, "merge_and_unload", lambda self, *a, **k: self.unload())
    with pytest.raises(MergeError, match="left adapted weights unchanged although their LoRA delta is non-zero"):
        merge_lora(starter_model_dir, trained, tmp_path / "out", **QUIET)


def test_merge_with_a_wrong_delta_fails_loudly(starter_model_dir, trained, tmp_path, monkeypatch):
    from peft.tuners.lora import LoraModel

    def double_one_delta(model):
        with torch.no_grad():
            layer = model.model.language_model.layers[0].self_attn.q_proj
            layer.weight.mul_(1.01)

    monkeypatch.setattr(LoraModel, "merge_and_unload", corrupting_merge(double_one_delta))
    with pytest.raises(MergeError, match=r"layers\.0\.self_attn\.q_proj\.weight: W_merged v differs"):
        merge_lora(starter_model_dir, trained, tmp_path / "out", **QUIET)


def test_merge_saved_in_bfloat16_reloads_within_its_rounding(starter_model_dir, trained, tmp_path):
    # the path of real Qwen3-VL checkpoints: proofs in float32, saved in the release's bfloat16
    report = merge_lora(starter_model_dir, trained, tmp_path / "bf16", save_dtype="bfloat16", **QUIET)
    with safe_open(str(tmp_path / "bf16" / "model.safetensors"), framework="pt") as handle:
        dtypes = {handle.get_slice(key).get_dtype() for key in handle.keys()}  # noqa: SIM118
    assert dtypes == {"BF16"}
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    assert report.save_dtype == "bfloat16" and report.proof_dtype == "float32"
    assert 0 < report.reload_max_abs_diff <= report.reload_tolerance, "bf16 rounding is visible but bounded"


# --- the checkpoint's dtype, and the memory preflight ----------------------------------------------


@pytest.fixture(scope="module")
def bf16_base(starter_model_dir, tmp_path_factory) -> Path:
    """The reduced starter stored in bfloat16, as Qwen3-VL releases are (its other files copied verbatim)."""
    out = tmp_path_factory.mktemp("bf16-base") / "model"
    out.mkdir()
    for path in starter_model_dir.iterdir():
        if path.is_file() and not path.name.endswith(".safetensors") and path.name != "config.json":
            shutil.copy2(path, out / path.name)
    load_policy(starter_model_dir, device="cpu", dtype=torch.bfloat16).model.save_pretrained(out)
    return out


def test_bf16_checkpoint_is_merged_and_proved_in_bf16_and_stays_bf16(bf16_base, tmp_path):
    # given a bfloat16 base model and a LoRA adapter on it,
    adapter = make_adapter(bf16_base, tmp_path / "adapter", scale=0.5)
    # when it is merged with the defaults,
    report = merge_adapter(bf16_base, adapter, tmp_path / "out", **QUIET)
    # then it was loaded, merged and proved in bfloat16 (one bf16 copy in memory, not a float32 one),
    assert (report.proof_dtype, report.save_dtype) == ("bfloat16", "bfloat16")
    with safe_open(str(tmp_path / "out" / "model.safetensors"), framework="pt") as handle:
        assert {handle.get_slice(key).get_dtype() for key in handle.keys()} == {"BF16"}  # noqa: SIM118
    # the weights moved exactly where LoRA applies,
    base, after = (
        load_file(str(bf16_base / "model.safetensors")),
        load_file(str(tmp_path / "out" / "model.safetensors")),
    )
    changed = {key for key in base if not torch.equal(base[key], after[key])}
    assert changed == adapted_weight_keys(adapter) and report.changed_tensors == len(changed) == 12
    # the merged logits match base + adapter within bf16's tolerance, and the saved directory reloads to them.
    assert report.logits_max_abs_diff <= report.logits_tolerance and report.reload_max_abs_diff == 0.0
    assert report.adapter_effect > report.logits_tolerance, "the adapter's effect is far above bf16 rounding"
    with_adapter = load_policy(bf16_base, adapter_dir=adapter, device="cpu", dtype=torch.bfloat16)
    reloaded = load_policy(tmp_path / "out", device="cpu", dtype=torch.bfloat16)
    inputs = model_inputs(with_adapter.processor, *proofs.probe_contexts(with_adapter.processor))
    reference = proofs.probe_logits(with_adapter.model, inputs)
    difference = float((proofs.probe_logits(reloaded.model, inputs) - reference).abs().max())
    assert difference <= report.logits_tolerance, f"reloaded bf16 logits differ by {difference}"


def test_merge_that_would_not_fit_in_memory_is_refused_with_the_numbers_before_loading(
    starter_model_dir, trained, tmp_path, monkeypatch
):
    from mazerl.merge.memory import GIB, MergeMemoryError

    def no_loading(*_args, **_kwargs):
        raise AssertionError("the base model must not be loaded before the memory check")

    monkeypatch.setattr("mazerl.policy.loader.load_policy", no_loading)
    # given a machine with 1.5 GiB free (a flow-run pod's share, say),
    with pytest.raises(MergeMemoryError) as caught:
        merge_lora(starter_model_dir, trained, tmp_path / "out", available_memory=(int(1.5 * GIB), "test"), **QUIET)
    # then the merge says what it needs, what there is, and where to run it.
    message = str(caught.value)
    assert "needs about 2.0 GiB" in message and "has 1.5 GiB available (test)" in message, message
    assert "Ray job" in message and not (tmp_path / "out").exists()


def test_memory_need_of_an_8b_bf16_model_fits_the_head_not_the_flow_pod():
    from mazerl.merge.memory import GIB, MergeMemoryError, check_merge_memory, merge_memory

    need = merge_memory(int(16.3 * GIB))  # Qwen3-VL-8B in bfloat16
    assert 22 * GIB < need.total_bytes < 24 * GIB, need.describe()
    check_merge_memory(need, (420 * GIB, "the Ray head's pod"))
    with pytest.raises(MergeMemoryError, match="has 8.0 GiB available"):
        check_merge_memory(need, (8 * GIB, "the flow-run pod"))


def test_the_merge_asks_for_the_cpus_of_the_roomiest_node_that_has_its_memory_and_threads_follow(monkeypatch):
    import torch

    from mazerl.merge import job_entry
    from mazerl.merge.memory import GIB, MAX_MERGE_CPUS, merge_cpus, merge_memory

    def node(cpus, memory_gib, state="ALIVE"):
        return {"state": state, "resources_total": {"CPU": cpus, "memory": memory_gib * GIB}}

    need = merge_memory(int(16.3 * GIB))
    # the hyperpod shape: a head of 52 CPUs / 420 GiB, GPU workers of 40 / 440 GiB; a flow pod has no Ray node
    assert merge_cpus(need, [node(52, 420), node(40, 440), node(40, 440)]) == MAX_MERGE_CPUS == 16
    assert merge_cpus(need, [node(8, 440), node(64, 16), node(64, 440, "DEAD")]) == 8, (
        "only ALIVE nodes with the memory"
    )
    assert merge_cpus(need, []) == 1, "nothing known: one CPU, as before"
    # The job's torch threads: what it asked Ray for, within what this machine lets it use.
    threads = torch.get_num_threads()
    try:
        monkeypatch.setattr(job_entry, "usable_cpus", lambda: 2)
        assert job_entry.set_threads(16) == "2 torch threads (asked Ray for 16 CPUs; 2 usable here)"
        assert torch.get_num_threads() == 2
        assert job_entry.set_threads(1).startswith("1 torch threads") and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize(
    ("request_text", "says"),
    [
        ("{not json", "cannot use merge request"),
        ('{"base_model": "/m"}', "lacks checkpoints_dir, out_dir, probe_eval_set"),
    ],
)
def test_merge_entry_refuses_an_unusable_request_with_exit_2(tmp_path, capsys, request_text, says):
    from mazerl.merge.job_entry import EXIT_CONFIG_ERROR, main

    path = tmp_path / "merge_request.json"
    path.write_text(request_text)
    assert main(["--config", str(path)]) == EXIT_CONFIG_ERROR
    assert says in capsys.readouterr().out


def test_merge_entry_with_no_checkpoint_is_exit_2_not_a_retry(starter_model_dir, tmp_path, capsys):
    from mazerl.merge.job_entry import EXIT_CONFIG_ERROR, main

    request = {
        "base_model": str(starter_model_dir),
        "checkpoints_dir": str(tmp_path / "no-checkpoints"),
        "out_dir": str(tmp_path / "merged"),
        "probe_eval_set": "maze256-small-v1",
        "mlflow_model_dir": str(tmp_path / "mlflow_model"),
        "max_artifact_mb": 512,
    }
    (tmp_path / "merge_request.json").write_text(json.dumps(request))
    assert main(["--config", str(tmp_path / "merge_request.json")]) == EXIT_CONFIG_ERROR
    assert "the train stage wrote no checkpoint" in capsys.readouterr().out
