"""The ``vllm`` engine on the real vLLM (0.30.0's CPU build, `make test-vllm`), reply for reply against the ``hf`` engine.

Greedy episodes on the first :data:`MAZES` mazes of the embedded eval set, in the starter's context mode, through
the project's ``VLLMEngine`` with ``MAZERL_VLLM_DEVICE=cpu`` (float32, eager), must be the ``hf`` engine's (a
``transformers`` model, float32 on the CPU), maze for maze, on:

- the shipped starter, a real policy (it solves about 40% of held-out mazes, so its moves follow the frames);
- a merged model: the project's merge of an adapter on the text decoder and the vision tower;
- that adapter served unmerged, as vLLM's LoRA request: vLLM applies its ``visual.*`` modules only with
  ``enable_tower_connector_lora``, which the engine sets from the adapter's weights;
- the eval stage's vLLM actor, on a local Ray head that declares one GPU (Ray places the actor; vLLM runs on the
  CPU), as ``evaluate()`` runs it on a cluster;
- the GPU smoke row's vLLM checks (its multi-modal request, with and without a zero adapter).

The tests need vLLM: the main suite deselects them (`-m "not vllm"`), and in another venv they fail on the import.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from lora_adapters import make_adapter, vision_tower_targets
from safetensors import safe_open
from safetensors.torch import save_file

from envs.evalset import load as load_eval_set
from mazerl.policy.engines import GenerationSettings, HFEngine
from mazerl.policy.episodes import run_episodes
from mazerl.policy.loader import load_policy, load_processor
from mazerl.policy.vllm_engine import CPU_KVCACHE_VAR, DEVICE_VAR, TOWER_LORA_ARG, VLLMEngine
from mazerl.starter.record import recorded_context_mode
from mazerl.starter.shipped import shipped_starter

pytestmark = pytest.mark.vllm

MAZES = 32
EVAL_SET = "maze256-small-v1"
GREEDY = GenerationSettings(greedy=True, max_new_tokens=24)  # the eval stage's decoding
# lora_B of this size (lora_A seeded too: the same adapter every run) gives the adapter's vision-tower part alone
# 14 of the 32 episodes: without enable_tower_connector_lora vLLM played those as the adapter less its tower part.
ADAPTER_SCALE = 0.2

Moves = list[list[str]]  # the replies of each maze's episode, in maze order


@pytest.fixture(scope="module", autouse=True)
def vllm_on_the_cpu():
    """The setting under test: the engine runs on vLLM's CPU platform (1 GiB of KV cache)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(DEVICE_VAR, "cpu")
        patch.setenv(CPU_KVCACHE_VAR, "1")
        yield


@pytest.fixture(scope="module")
def starter() -> Path:
    return shipped_starter()


@pytest.fixture(scope="module")
def tower_adapter(starter, tmp_path_factory) -> Path:
    """A real PEFT adapter where the trainer puts it with ``freeze_vision: false``: text decoder and vision tower."""
    out = tmp_path_factory.mktemp("tower") / "adapter"
    return make_adapter(starter, out, scale=ADAPTER_SCALE, targets=vision_tower_targets(starter))


def hf_moves(model_dir: Path, adapter_dir: Path | None = None) -> Moves:
    policy = load_policy(model_dir, adapter_dir=adapter_dir, device="cpu")
    return play(HFEngine.from_policy(policy), policy.processor, model_dir)


def vllm_moves(model_dir: Path, adapter_dir: Path | None = None) -> Moves:
    engine = VLLMEngine(model_dir, load_processor(model_dir), adapter_dir=adapter_dir)
    try:
        return play(engine, engine.processor, model_dir)
    finally:
        engine.close()  # one engine's processes at a time on 2 cores


def play(engine, processor, model_dir: Path) -> Moves:
    eval_set = load_eval_set(EVAL_SET)
    history_images, history_text = recorded_context_mode(model_dir)
    episodes = run_episodes(
        engine,
        processor,
        eval_set.layouts[:MAZES],
        GREEDY,
        max_moves=eval_set.max_moves,
        cell_px=eval_set.cell_px,
        history_images=history_images,
        history_text=history_text,
    )
    return [episode.actions for episode in episodes]


def differing(a: Moves, b: Moves) -> list[int]:
    """The mazes whose episodes differ, reply for reply."""
    return [index for index, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]


@pytest.fixture(scope="module")
def starter_hf_moves(starter) -> Moves:
    return hf_moves(starter)


def test_the_starters_greedy_episodes_are_the_hf_engines(starter, starter_hf_moves):
    moves = vllm_moves(starter)
    assert differing(moves, starter_hf_moves) == [], "vLLM's episodes must be the hf engine's, maze for maze"
    replies = {reply for episode in starter_hf_moves for reply in episode}
    assert len(replies) >= 4, f"a policy whose moves follow the frames, not one reply: {replies}"


def test_a_merged_models_greedy_episodes_are_the_hf_engines(starter, tower_adapter, starter_hf_moves, tmp_path):
    from mazerl.merge.lora import merge_adapter

    merged = tmp_path / "merged"
    merge_adapter(starter, tower_adapter, merged, log=lambda _: None)
    expected = hf_moves(merged)
    assert differing(expected, starter_hf_moves), "the merge changes the policy (a vLLM serving the base would fail)"
    assert differing(vllm_moves(merged), expected) == []


def without_tower_modules(adapter_dir: Path, out: Path) -> Path:
    """The adapter less its ``visual.*`` tensors: what vLLM serves without ``enable_tower_connector_lora``."""
    shutil.copytree(adapter_dir, out)
    weights = out / "adapter_model.safetensors"
    with safe_open(str(weights), framework="pt") as handle:
        kept = {key: handle.get_tensor(key) for key in handle.keys() if "visual" not in key.split(".")}  # noqa: SIM118
    save_file(kept, str(weights))
    return out


def test_an_adapter_on_the_vision_tower_is_served_with_its_tower_modules(starter, tower_adapter, tmp_path):
    expected = hf_moves(starter, tower_adapter)
    # the adapter's tower part decides some episodes (so a vLLM that ignored it, as without the flag, would fail)
    language_only = hf_moves(starter, without_tower_modules(tower_adapter, tmp_path / "language-only"))
    assert differing(expected, language_only), "the vision tower's adapters must change some episodes"
    engine = VLLMEngine(starter, load_processor(starter), adapter_dir=tower_adapter)
    try:
        moves = play(engine, engine.processor, starter)
        tower_lora = engine.llm.llm_engine.vllm_config.lora_config.enable_tower_connector_lora
    finally:
        engine.close()
    assert differing(moves, expected) == [], f"{TOWER_LORA_ARG} must put the adapter on the vision tower too"
    assert tower_lora is True


def test_the_eval_stages_vllm_actor_plays_the_hf_engines_episodes(starter, starter_hf_moves, tmp_path):
    from mazerl.cluster.head.driver import ray_driver
    from mazerl.cluster.head.local import start_local_head
    from mazerl.evaluation.evaluate import evaluate
    from mazerl.evaluation.settings import EvalSettings

    # given a local Ray head that declares one GPU, the vLLM CPU setting in its environment (as a pod's would be)
    temp = tempfile.mkdtemp(prefix="mzr-v", dir="/tmp")
    head = start_local_head(
        temp, num_cpus=2, num_gpus=1, object_store_mb=150, dashboard_port=0, extra_env={DEVICE_VAR: "cpu"}
    )
    settings = EvalSettings(eval_set=EVAL_SET, eval_engine="vllm", max_eval_mazes=MAZES, gif_count=0)
    try:
        # when the eval stage runs with eval_engine vllm (one worker, one GPU: the engine's default)
        with ray_driver(head):
            report = evaluate(starter, settings, tmp_path / "eval", log=lambda _: None)
    finally:
        head.stop()
        shutil.rmtree(temp, ignore_errors=True)
    # then its actor got the GPU Ray had, ran vLLM on the CPU, and played the hf engine's episodes
    summary = json.loads(report.summary_path.read_text())
    assert summary["gpus_per_worker"] == 1.0 and summary["settings"]["engine"] == "vllm"
    (placement,) = summary["worker_placement"]
    assert placement["gpu_ids"] == ["0"] and placement["device"] == "cpu"
    rows = [json.loads(line) for line in report.results_path.read_text().splitlines()]
    assert report.n == MAZES and differing([row["actions"] for row in rows], starter_hf_moves) == []


def test_the_gpu_smoke_rows_vllm_checks_generate_from_a_maze_frame(starter):
    from mazerl.cluster.checks.gpu_smoke import vllm_checks

    checks = ["vllm_generate", "lora_adapter"]
    request = {"base_model": str(starter), "checks": checks, "lora_rank": 8, "lora_targets": ["q_proj", "v_proj"]}
    found = vllm_checks(request, checks, "cpu")
    assert found["vllm_generate"]["ok"] and "after a maze frame" in found["vllm_generate"]["found"], found
    assert found["lora_adapter"]["ok"], found
