"""The vllm engine's request construction, checked against the hf engine's inputs without vLLM.

These tests run in the main suite, where vLLM is not installed, so they do not generate with vLLM.
They check what the engine hands to it: with the real starter processor and chat template,
the token prompt vLLM receives expands (by vLLM's own rule: each ``<|image_pad|>`` becomes
the frame's token count) back into exactly the context the hf engine feeds the model, with
the same frames, stop tokens, banned tokens and decoding settings, and the engine arguments
(the CPU setting, LoRA slots, the vision tower's LoRA). One test drives ``VLLMEngine.generate``
through a stand-in for ``vllm.LLM`` (``_FakeLLM``) to check the wiring; the real generation is
tests/test_vllm_engine_cpu.py's, on vLLM's CPU build (``make test-vllm``).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from lora_adapters import make_adapter, vision_tower_targets

from envs.maze import MazeEnv, solve
from mazerl.policy.chat import ChatError, Conversation, image_token_id, model_inputs, render
from mazerl.policy.engines import GenerationRequest, GenerationSettings, HFEngine
from mazerl.policy.loader import load_policy
from mazerl.policy.vllm_engine import (
    CPU_KVCACHE_VAR,
    DEVICE_VAR,
    VllmApi,
    VLLMEngine,
    banned_token_ids,
    collapse_image_pads,
    engine_kwargs,
    load_vllm_api,
    lora_rank_slot,
    result_from_output,
    sampling_kwargs,
    stop_token_ids,
    vllm_device,
    vllm_prompt,
)

# The processor inputs the vLLM engine builds with transformers, on the image's transformers too (`make test-image-stack`).
pytestmark = pytest.mark.image_stack


def expand_image_pads(input_ids: list[int], image_pad_id: int, tokens_per_image: list[int]) -> list[int]:
    """The inverse of :func:`mazerl.policy.vllm_engine.collapse_image_pads`: what vLLM's prompt update does to a token prompt."""
    expanded: list[int] = []
    images = iter(tokens_per_image)
    for token in input_ids:
        expanded += [token] * next(images) if token == image_pad_id else [token]
    return expanded


@pytest.fixture(scope="module")
def policy(starter_model_dir):
    return load_policy(starter_model_dir, device="cpu")


def episode_requests(processor, turns: int) -> list[GenerationRequest]:
    """Contexts of a real episode (the solver's replies), one per turn, as the episode runner renders them."""
    env = MazeEnv(size=7, cell_px=16, max_moves=15)
    frame, _ = env.reset(seed=3)
    conversation = Conversation.start(env.prompt(), frame)
    requests = []
    for action in solve(env.layout)[:turns]:
        ids, images = render(processor, conversation)
        requests.append(GenerationRequest(ids, images))
        reply_ids = processor.tokenizer(action, add_special_tokens=False)["input_ids"]
        frame, *_, info = env.step(action)
        conversation.add_reply(reply_ids, action)
        conversation.add_observation(info["feedback"], frame)
    return requests


def test_vllm_prompt_expands_back_to_the_hf_engines_input_ids(policy):
    processor = policy.processor
    pad = image_token_id(processor)
    for request in episode_requests(processor, turns=3):
        # given the context the hf engine would generate from
        hf_inputs = model_inputs(processor, [request.input_ids], [request.images])
        hf_ids = hf_inputs["input_ids"][0].tolist()
        # when the vllm engine builds its prompt
        prompt = vllm_prompt(request, pad)
        ids = prompt["prompt_token_ids"]
        # then it holds one placeholder per frame, and vLLM's expansion restores the hf context token for token
        assert ids.count(pad) == len(request.images) >= 1
        per_image = (hf_inputs["image_grid_thw"].prod(-1) // processor.image_processor.merge_size**2).tolist()
        assert expand_image_pads(ids, pad, per_image) == hf_ids, "vLLM must see exactly the hf engine's context"
        # and the frames are the same pixels, in order
        frames = prompt["multi_modal_data"]["image"]
        assert len(frames) == len(request.images)
        for image, frame in zip(frames, request.images, strict=True):
            assert image.mode == "RGB" and np.array_equal(np.asarray(image), frame)


def test_stop_and_banned_tokens_are_the_hf_engines(policy, starter_model_dir):
    hf = HFEngine(policy.model, policy.processor)
    stops = stop_token_ids(policy.processor, starter_model_dir)
    assert stops == hf.eos_ids
    assert banned_token_ids(policy.processor, stops) == hf.banned_ids
    assert image_token_id(policy.processor) in hf.banned_ids, "a reply must never contain an image placeholder"


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        (GenerationSettings(greedy=True, max_new_tokens=12), {"temperature": 0.0, "max_tokens": 12}),
        (
            GenerationSettings(greedy=False, temperature=0.7, top_p=0.9, max_new_tokens=24),
            {"temperature": 0.7, "top_p": 0.9, "max_tokens": 24},
        ),
    ],
    ids=["greedy", "sampled"],
)
def test_sampling_arguments_follow_the_generation_settings(settings, expected):
    kwargs = sampling_kwargs(settings, index=0, stop_ids=[7], banned_ids=[3, 4])
    assert {k: kwargs[k] for k in expected} == expected
    assert kwargs["stop_token_ids"] == [7] and kwargs["skip_special_tokens"] is True
    assert kwargs["logit_bias"] == {3: -100.0, 4: -100.0}
    assert "top_k" not in kwargs, "no top-k, as the hf engine"


def test_sampling_seeds_differ_per_request_and_repeat_per_call():
    settings = GenerationSettings(greedy=False, seed=11)
    seeds = [sampling_kwargs(settings, i, [7], [])["seed"] for i in range(4)]
    assert len(set(seeds)) == 4 and seeds == [sampling_kwargs(settings, i, [7], [])["seed"] for i in range(4)]
    assert "seed" not in sampling_kwargs(GenerationSettings(greedy=True, seed=11), 0, [7], [])


@pytest.mark.parametrize(
    ("token_ids", "expected"),
    [([5, 6, 7], [5, 6, 7]), ([5, 7, 8, 9], [5, 7]), ([5, 6], [5, 6]), ([], [])],
    ids=["ends-on-stop", "cut-after-stop", "length-limit", "empty"],
)
def test_results_keep_the_stop_token_and_nothing_after_it(token_ids, expected):
    assert result_from_output(token_ids, "text", stop_ids=[7]).response_ids == expected


@pytest.mark.parametrize(
    ("ids", "images"),
    [([1, 9, 9, 2], 2), ([1, 2], 1), ([9, 9, 1, 9], 1)],
    ids=["one-run-two-frames", "no-run-one-frame", "two-runs-one-frame"],
)
def test_pad_runs_that_do_not_match_the_frames_are_refused(ids, images):
    with pytest.raises(ChatError, match="runs of image tokens"):
        collapse_image_pads(ids, image_pad_id=9, num_images=images)


@pytest.mark.parametrize(("rank", "slot"), [(1, 1), (8, 8), (32, 32), (33, 64), (200, 256)])
def test_lora_rank_fits_vllms_slots(rank, slot):
    assert lora_rank_slot(rank) == slot


@pytest.fixture(scope="module")
def adapters(starter_model_dir, tmp_path_factory):
    """Real PEFT adapters (rank 4) where the trainer puts them: the text decoder only, and with the vision tower."""
    work = tmp_path_factory.mktemp("adapters")
    tower = vision_tower_targets(starter_model_dir)
    return {
        "language": make_adapter(starter_model_dir, work / "language", scale=0.0),
        "tower": make_adapter(starter_model_dir, work / "tower", scale=0.0, targets=tower),
    }


def test_an_adapter_on_the_vision_tower_enables_vllms_tower_lora(starter_model_dir, adapters):
    # vLLM drops every visual.* LoRA module ("will be ignored") unless enable_tower_connector_lora is on
    tower = engine_kwargs(starter_model_dir, adapters["tower"], 16, None, 0.5, seed=0)
    assert tower["enable_lora"] is True and tower["enable_tower_connector_lora"] is True
    language = engine_kwargs(starter_model_dir, adapters["language"], 16, None, 0.5, seed=0)
    assert language["enable_lora"] is True and "enable_tower_connector_lora" not in language


def test_engine_arguments_enable_prefix_caching_and_lora(starter_model_dir, adapters):
    kwargs = engine_kwargs(starter_model_dir, adapters["language"], 16, 4096, 0.5, seed=3)
    assert kwargs["enable_prefix_caching"] is True and kwargs["limit_mm_per_prompt"] == {"image": 16}
    assert kwargs["enable_lora"] is True and kwargs["max_lora_rank"] == 8 and kwargs["max_model_len"] == 4096
    assert kwargs["dtype"] == "bfloat16" and "enforce_eager" not in kwargs, "CUDA: bf16, CUDA graphs"
    assert "enable_lora" not in engine_kwargs(starter_model_dir, None, 16, None, 0.5, seed=3)


def test_the_cpu_setting_runs_vllm_in_float32_eagerly(starter_model_dir):
    kwargs = engine_kwargs(starter_model_dir, None, 16, None, 0.5, seed=3, device="cpu")
    assert kwargs["dtype"] == "float32" and kwargs["enforce_eager"] is True


def test_building_the_engine_without_gpu_names_the_cpu_setting(monkeypatch):
    assert not torch.cuda.is_available(), "this test describes a machine without a GPU"
    monkeypatch.delenv(DEVICE_VAR, raising=False)
    with pytest.raises(RuntimeError, match=r"engine='hf'.*MAZERL_VLLM_DEVICE=cpu"):
        load_vllm_api(vllm_device())


def test_the_cpu_setting_without_vllm_says_where_vllm_comes_from(monkeypatch):
    monkeypatch.setenv(DEVICE_VAR, "cpu")
    monkeypatch.delenv(CPU_KVCACHE_VAR, raising=False)
    with pytest.raises(RuntimeError, match="needs the 'vllm' package"):
        load_vllm_api(vllm_device())
    assert os.environ[CPU_KVCACHE_VAR] == "1", "vLLM's CPU KV cache is bounded unless given"


def test_an_unknown_device_setting_is_refused(monkeypatch):
    monkeypatch.setenv(DEVICE_VAR, "tpu")
    with pytest.raises(ValueError, match=r"MAZERL_VLLM_DEVICE='tpu' must be 'cuda' \(the default\) or 'cpu'"):
        vllm_device()


class _Completion:
    def __init__(self, token_ids, text, finish_reason, stop_reason=None):
        self.token_ids, self.text, self.finish_reason, self.stop_reason = token_ids, text, finish_reason, stop_reason


class _FakeLLM:
    """Stands in for vllm.LLM (which needs a GPU): records the call, answers each prompt."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.calls = []

    def generate(self, prompts, params, lora_request=None, use_tqdm=True):
        self.calls.append((prompts, params, lora_request))
        outputs = []
        for index, _ in enumerate(prompts):
            # first request: stop token reported only as stop_reason; second: truncated at max_tokens
            completion = (
                _Completion([11, 12], "left", "stop", stop_reason=params[0]["stop_token_ids"][0])
                if index == 0
                else _Completion([11, 12, 13], "lef", "length")
            )
            outputs.append(type("RequestOutput", (), {"outputs": [completion]})())
        return outputs


def test_generate_wires_prompts_params_and_adapter_mocked_vllm(policy, starter_model_dir, adapters, monkeypatch):
    monkeypatch.delenv(DEVICE_VAR, raising=False)
    adapter = adapters["language"]
    api = VllmApi(LLM=_FakeLLM, SamplingParams=dict, LoRARequest=dict)
    engine = VLLMEngine(starter_model_dir, policy.processor, adapter_dir=adapter, api=api)
    requests = episode_requests(policy.processor, turns=2)
    results = engine.generate(requests, GenerationSettings(greedy=True, max_new_tokens=5))
    prompts, params, lora = engine.llm.calls[0]
    assert [p["prompt_token_ids"] for p in prompts] == [
        vllm_prompt(r, engine.image_pad_id)["prompt_token_ids"] for r in requests
    ]
    assert all(p["temperature"] == 0.0 and p["max_tokens"] == 5 for p in params)
    assert lora == {"lora_name": "policy", "lora_int_id": 1, "lora_path": str(adapter)}
    assert engine.llm.kwargs["enable_lora"] and engine.llm.kwargs["model"] == str(starter_model_dir)
    eot = engine.stop_ids[0]
    assert results[0].response_ids == [11, 12, eot] and results[0].text == "left"
    assert results[1].response_ids == [11, 12, 13]
    assert engine.generate([], GenerationSettings()) == []


def test_a_vllm_without_the_tower_lora_argument_refuses_a_tower_adapter(policy, starter_model_dir, adapters):
    # given a vLLM whose engine arguments lack enable_tower_connector_lora (it would ignore visual.* modules)
    accepted = frozenset({"model", "dtype", "enable_lora", "max_loras", "max_lora_rank"})
    api = VllmApi(LLM=_FakeLLM, SamplingParams=dict, LoRARequest=dict, engine_args=accepted)
    # then an adapter on the vision tower is refused, naming the argument and the ways out
    with pytest.raises(RuntimeError, match=r"enable_tower_connector_lora.*vLLM 0\.30\.0.*merge the adapter"):
        VLLMEngine(starter_model_dir, policy.processor, adapter_dir=adapters["tower"], api=api)
    # and one on the text decoder only is served
    assert VLLMEngine(starter_model_dir, policy.processor, adapter_dir=adapters["language"], api=api).lora_request
