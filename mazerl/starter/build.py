"""The tiny Qwen3-VL starter model: the embedded default's stand-in for an SFT checkpoint.

No weights can be downloaded, so the project builds its own starting policy, seeded and
reproducible, as an ordinary Hugging Face directory that :func:`mazerl.policy.loader.load_policy`
reads like any Qwen3-VL checkpoint:

1. a byte-level BPE tokenizer trained locally over the prompt/feedback/action vocabulary,
   with the Qwen special tokens, and a Qwen-style chat template;
2. an image processor sized for maze frames: 16 px patches, spatial merge 1, so each cell
   of the 7x7 world at 16 px is exactly one image token (49 per frame);
3. a ``Qwen3VLForConditionalGeneration`` with text 128 x 4 layers and vision 128 x 4;
4. a warm-start (:mod:`mazerl.starter.warmstart`): imitation of the shortest-path solver
   through the real processor and chat template, so the starter solves a minority of the
   embedded eval mazes, as the VisGym SFT checkpoint did for the reference run.

The embedded default uses the copy shipped with the package (:mod:`mazerl.starter.shipped`:
the same weights on every machine); ``mazerl build-starter`` rebuilds it (``--ship`` replaces
the shipped copy), and :func:`ensure_starter` puts it under the data root.
The directory is built under a temporary name and renamed into place, under a file lock,
and records its config (:class:`~mazerl.starter.config.StarterConfig`), learning curve and a
weights digest in ``starter.json`` (:mod:`mazerl.starter.record`).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import random
import shutil
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import torch
from filelock import FileLock

from envs.maze import ACCEPTED_FORMS, DIRECTION_WORDS, MazeEnv, action_text
from mazerl import paths
from mazerl.atomic import install_dir, temporary_sibling
from mazerl.policy.loader import image_only_processor_class
from mazerl.starter.config import StarterConfig
from mazerl.starter.record import RECORD_FILE, StarterError, read_record
from mazerl.starter.shipped import SHIPPED_NAME, shipped_starter
from mazerl.starter.warmstart import warm_start as run_warm_start

STARTER_NAME = SHIPPED_NAME  # maze-starter-v6: v5 with answer_noise 0.85 (history_text 'tried', 1.2 epochs)
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
# Qwen-style template: text parts and image placeholders in message order, one
# <|im_start|>role ... <|im_end|> block per message, generation prompt "<|im_start|>assistant\n".
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'image' or 'image' in part or 'image_url' in part %}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif part['type'] == 'text' %}{{- part['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


# --------------------------------------------------------------------------------------
# Tokenizer, processor, model config
# --------------------------------------------------------------------------------------


def tokenizer_corpus() -> list[str]:
    """The text between special tokens in every conversation the maze world produces.

    Chunks as the chat template lays them out: ``user\n`` + a prompt or feedback text
    (the image and the end of the message are special tokens), ``assistant\n`` alone
    (replies are generated separately), the replies, and the ``\n`` after each message.
    """
    observations: list[str] = []
    replies: list[str] = []
    for action_format in ("tuple", "keyword"):
        for size in (5, 7, 9, 11, 13):
            for budget in (10, 15, 20, 30):
                observations.append(MazeEnv(size=size, max_moves=budget, action_format=action_format).prompt())
        replies += [action_text(action, action_format) for action in range(5)]
        observations.append(f"Could not read an action. Reply with exactly one of: {ACCEPTED_FORMS[action_format]}.")
    feedback = [f"Moved {word}." for word in DIRECTION_WORDS.values()]
    feedback += [f"Cannot move {word} into a wall." for word in DIRECTION_WORDS.values()]
    feedback += ["Stopped on the target.", "Stopped away from the target."]
    observations += feedback + [text + " The move budget is spent." for text in feedback]
    # Weighted roughly as an episode uses them: one prompt, then per turn a reply and a feedback line.
    return (
        [f"user\n{text}" for text in observations]
        + [f"user\n{text}" for text in feedback] * 40
        + replies * 40
        + ["assistant\n", "\n"] * 200
        + ["system\n"]
    )


def build_tokenizer(vocab_size: int) -> Any:
    """Byte-level BPE with the Qwen special tokens, as a HF fast tokenizer.

    Byte-level keeps any text encodable. Merges may cross spaces (no pre-tokenizer split):
    over this small, repetitive corpus that turns whole fixed phrases (an action, a
    feedback line, most of the task prompt) into single tokens, which keeps contexts, and
    so the warm-start, rollouts and GRPO, about half as long as word-level tokens would.
    """
    # tokenizers and transformers load only for a build (the pipeline imports this module to copy the starter)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(tokenizer_corpus(), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )


def build_image_processor(config: StarterConfig) -> Any:
    """Qwen2-VL image processing (PIL backend) with one patch per maze cell and no merging."""
    from transformers import Qwen2VLImageProcessorPil  # heavy: only for a build

    return Qwen2VLImageProcessorPil(
        patch_size=config.patch_size,
        merge_size=1,
        temporal_patch_size=2,
        # Frames from 4x4 to 24x24 patches pass unresized (7x7 at 16 px is 112x112 = 49 patches).
        size={"shortest_edge": (4 * config.patch_size) ** 2, "longest_edge": (24 * config.patch_size) ** 2},
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )


def video_processor_config(config: StarterConfig) -> dict[str, Any]:
    """What a stock Qwen3-VL processor loads where torchvision exists (vLLM builds it too)."""
    return {
        "video_processor_type": "Qwen3VLVideoProcessor",
        "processor_class": "Qwen3VLProcessor",
        "patch_size": config.patch_size,
        "temporal_patch_size": 2,
        "merge_size": 1,
        "size": {"shortest_edge": (4 * config.patch_size) ** 2, "longest_edge": (24 * config.patch_size) ** 2 * 8},
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "do_sample_frames": True,
        "fps": 2,
        "min_frames": 4,
        "max_frames": 64,
    }


def model_config(config: StarterConfig, tokenizer: Any) -> Any:
    from transformers import Qwen3VLConfig  # heavy: only for a build

    head_dim = config.text_hidden // config.text_heads
    if head_dim != 32:
        raise StarterError(f"text_hidden/text_heads = {head_dim}; the mrope section [8, 4, 4] needs head_dim 32")
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS}
    return Qwen3VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": config.text_hidden,
            "intermediate_size": config.text_intermediate,
            "num_hidden_layers": config.text_layers,
            "num_attention_heads": config.text_heads,
            "num_key_value_heads": config.text_heads,
            "head_dim": head_dim,
            "max_position_embeddings": 4096,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [8, 4, 4],
                "mrope_interleaved": True,
            },
            "pad_token_id": ids["<|endoftext|>"],
            "bos_token_id": None,
            "eos_token_id": ids["<|im_end|>"],
        },
        vision_config={
            "depth": config.vision_layers,
            "hidden_size": config.vision_hidden,
            "intermediate_size": config.vision_intermediate,
            "num_heads": config.vision_heads,
            "patch_size": config.patch_size,
            "spatial_merge_size": 1,
            "temporal_patch_size": 2,
            "out_hidden_size": config.text_hidden,
            "num_position_embeddings": 49,  # a 7x7 learned grid: exact for the embedded world, interpolated elsewhere
            "deepstack_visual_indexes": [0],
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )


def image_only_processor(tokenizer: Any, image_processor: Any) -> Any:
    return image_only_processor_class()(image_processor, tokenizer, chat_template=CHAT_TEMPLATE)


def save_processor(directory: Path, tokenizer: Any, image_processor: Any, config: StarterConfig) -> None:
    """Write a stock-format Qwen3-VL processor: tokenizer, image + video processor configs, template."""
    tokenizer.save_pretrained(directory)
    image_processor.save_pretrained(directory)
    (directory / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    (directory / "processor_config.json").write_text(json.dumps({"processor_class": "Qwen3VLProcessor"}, indent=2))
    (directory / "video_preprocessor_config.json").write_text(json.dumps(video_processor_config(config), indent=2))


def weights_digest(model: torch.nn.Module) -> str:
    """SHA-256 over (name, dtype, shape, bytes) of every tensor in the state dict, by name."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


# --------------------------------------------------------------------------------------
# Build, cache
# --------------------------------------------------------------------------------------


def set_determinism(seed: int, threads: int) -> None:
    """Same seed and thread count on the same machine -> same weights, bit for bit."""
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    torch.use_deterministic_algorithms(True)


def _untrained_model(config: StarterConfig, log: Callable[[str], None]) -> tuple[Any, Any, Any, torch.nn.Module, int]:
    """Steps 1-3: tokenizer, image processor, the processor of both, the initialised model and its parameter count."""
    from transformers import Qwen3VLForConditionalGeneration  # heavy: only for a build

    tokenizer = build_tokenizer(config.vocab_size)
    image_processor = build_image_processor(config)
    processor = image_only_processor(tokenizer, image_processor)
    model = Qwen3VLForConditionalGeneration(model_config(config, tokenizer)).float()
    parameters = sum(p.numel() for p in model.parameters())
    log(f"starter: {parameters / 1e6:.2f} M parameters, vocab {len(tokenizer)}, seed {config.seed}")
    return tokenizer, image_processor, processor, model, parameters


def _imitate_solver(
    model: torch.nn.Module,
    processor: Any,
    config: StarterConfig,
    log: Callable[[str], None],
    on_checkpoint: Callable[[torch.nn.Module, Any, int, float], dict[str, float]] | None,
    checkpoints: int,
) -> dict[str, Any]:
    """Step 4, the warm-start; its record for ``starter.json``, with ``on_checkpoint`` handed the model and processor."""
    measure = None
    if on_checkpoint is not None:

        def measure(step: int, epoch: float) -> dict[str, float]:
            return on_checkpoint(model, processor, step, epoch)

    return run_warm_start(model, processor, config, log=log, on_checkpoint=measure, checkpoints=checkpoints)


def _set_generation(model: torch.nn.Module, tokenizer: Any) -> None:
    """Eval mode and a greedy generation config that stops at the end of a turn, as the saved model should load."""
    from transformers import GenerationConfig  # heavy: only for a build

    model.eval()
    model.generation_config = GenerationConfig(
        eos_token_id=[tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.pad_token_id],
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    )


def _build_record(
    out_dir: Path, config: StarterConfig, digest: str, parameters: int, started: float, warm: dict[str, Any]
) -> dict[str, Any]:
    """``starter.json``'s content: name, config, weights digest, build time and versions, then the warm-start's."""
    return {
        "name": out_dir.name,
        "config": config.model_dump(mode="json"),
        "weights_sha256": digest,
        "parameters": parameters,
        # Wall time of the build itself (measurements taken by on_checkpoint excluded).
        "build_seconds": round(
            time.perf_counter() - started - warm.get("warm_start", {}).get("checkpoint_seconds", 0.0), 1
        ),
        "versions": {
            "torch": torch.__version__,
            "transformers": _version("transformers"),
            "python": platform.python_version(),
        },
        **warm,
    }


def build_starter(
    out_dir: str | os.PathLike,
    config: StarterConfig | None = None,
    log: Callable[[str], None] = print,
    warm_start: bool = True,
    on_checkpoint: Callable[[torch.nn.Module, Any, int, float], dict[str, float]] | None = None,
    checkpoints: int = 0,
) -> Path:
    """Build the starter into ``out_dir`` (which must not exist yet); returns its path.

    Everything is written to a temporary sibling directory first and renamed into place,
    so an interrupted build never leaves a directory that looks complete.
    ``on_checkpoint(model, processor, step, epoch)`` may measure the model ``checkpoints``
    times during the warm-start and at its end (benchmarks use it for the learning curve).
    """
    config = config or StarterConfig()
    out_dir = Path(out_dir).expanduser().resolve()
    if out_dir.exists():
        raise StarterError(f"out_dir={str(out_dir)!r} already exists; delete it or choose another --out")
    started = time.perf_counter()
    previous_threads = torch.get_num_threads()
    previous_deterministic = torch.are_deterministic_algorithms_enabled()
    tmp = temporary_sibling(out_dir)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        set_determinism(config.seed, config.torch_threads)
        tokenizer, image_processor, processor, model, parameters = _untrained_model(config, log)
        warm = _imitate_solver(model, processor, config, log, on_checkpoint, checkpoints) if warm_start else {}
        _set_generation(model, tokenizer)
        model.save_pretrained(tmp)
        save_processor(tmp, tokenizer, image_processor, config)
        digest = weights_digest(model)
        record = _build_record(out_dir, config, digest, parameters, started, warm)
        (tmp / RECORD_FILE).write_text(json.dumps(record, indent=2) + "\n")
        install_dir(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        torch.use_deterministic_algorithms(previous_deterministic)
        torch.set_num_threads(previous_threads)
    log(f"starter: wrote {out_dir} (weights sha256 {digest[:16]}..., {record['build_seconds']} s)")
    return out_dir


def _version(package: str) -> str:
    return version(package)


def starter_dir(root: str | os.PathLike | None = None) -> Path:
    return paths.models_dir(paths.data_root(root)) / STARTER_NAME


def ensure_starter(
    root: str | os.PathLike | None = None,
    config: StarterConfig | None = None,
    log: Callable[[str], None] = print,
) -> Path:
    """The starter under ``<data root>/models/<STARTER_NAME>``, put there first if missing.

    With the default config it is copied from the shipped, digest-checked data
    (:mod:`mazerl.starter.shipped`), so every machine gets the same weights; any other
    config is built. Concurrent callers (pipeline runs, test workers) wait on a file lock;
    exactly one copies or builds. A directory made with a different config is refused, never
    silently reused.
    """
    config = config or StarterConfig()
    target = starter_dir(root)
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.parent / f".{target.name}.lock")):
        if not target.exists() and config == StarterConfig():
            source = shipped_starter()
            log(f"starter: copying the shipped {source.name} to {target}")
            tmp = temporary_sibling(target)
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(source, tmp)
            install_dir(tmp, target)
        elif not target.exists():
            log(f"starter: {target} is missing; building it (about 3 minutes on 2 cores)")
            build_starter(target, config, log=log)
    recorded = read_record(target).get("config")
    if recorded != config.model_dump(mode="json"):
        raise StarterError(
            f"{target} was built with a different config ({recorded}); delete the directory to rebuild it with "
            f"{config.model_dump(mode='json')}"
        )
    return target
