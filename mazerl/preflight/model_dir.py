"""A model directory, read without executing any code from it and without reading the weights.

``base_model``: a Hugging Face vision-language model directory (config, weights whose safetensors
headers match their sizes, tokenizer, processor; a Qwen3-VL ``model_type`` and architecture), every
JSON file, the tokenizer and the chat template parsed. No ``base_model``: a starter already in the
data root is the shipped one (its digest) or a complete local build, before it is reused. A LoRA
adapter (``mazerl eval --adapter``): its config, and weights complete and of the config's rank.
"""

from __future__ import annotations

import json
from pathlib import Path

from mazerl import paths
from mazerl.cluster.checks.probe import check_model_dir, safetensors_header
from mazerl.preflight.input_error import InputError, short_message
from mazerl.starter.record import RECORD_FILE
from mazerl.starter.shipped import SHIPPED_DIGEST, SHIPPED_DIR, SHIPPED_NAME, directory_digest

# JSON files a Hugging Face model directory may hold besides config.json (read by transformers when present).
MODEL_JSON_FILES = (
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
    "generation_config.json",
    "chat_template.json",
)


def check_base_model(model_dir: Path, field: str = "base_model") -> None:
    """A loadable vision-language model directory; config files and weight headers are read, no weights, no code.

    ``field`` is the name the user gave it by (``base_model``, or ``--model`` for ``mazerl eval``). Every
    file the directory claims is parsed as what it must be (JSON, the tokenizer, the chat template), so a
    damaged one is named here instead of failing the first eval worker or the training job.
    """
    found = check_model_dir(str(model_dir))
    if "the directory itself" in found["missing"]:
        starter = ", or leave base_model empty for the embedded starter" if field == "base_model" else ""
        raise InputError(
            field,
            f"{field}={str(model_dir)!r} is not a directory; give the Hugging Face model directory "
            f"(config.json, weights, tokenizer, processor){starter}",
        )
    if found["missing"]:
        raise InputError(
            field,
            f"{field}={str(model_dir)!r} lacks {', '.join(found['missing'])}; copy the complete model directory "
            "(model.save_pretrained and processor.save_pretrained write all of it)",
        )
    problem = model_file_problem(Path(model_dir))
    if problem:
        raise InputError(
            field,
            f"{field}={str(model_dir)!r}: {problem}; copy the complete model directory (model.save_pretrained and "
            "processor.save_pretrained write all of it)",
        )
    # lazy: the loader imports torch (seconds), which `mazerl run --help` and the UI's parameter form do not need
    from mazerl.policy.loader import ModelLoadError, check_image_text_to_text

    try:
        check_image_text_to_text(model_dir)
    except ModelLoadError as exc:
        raise InputError(field, f"{field}: {exc}") from exc


def model_file_problem(model_dir: Path) -> str | None:
    """What is wrong with the tokenizer, processor and template files a model directory holds, or None.

    Each is parsed as its loader reads it: the JSON configs as JSON objects, ``tokenizer.json`` by the
    tokenizers library, ``chat_template.jinja`` by Jinja. Milliseconds (a Qwen3-VL tokenizer is 11 MB).
    """
    for name in MODEL_JSON_FILES:
        path = model_dir / name
        if not path.is_file():
            continue
        try:
            value = json.loads(path.read_bytes())
        except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            return f"{name} does not parse ({short_message(exc)})"
        if not isinstance(value, dict):
            return f"{name} holds a JSON {type(value).__name__}, not an object"
    tokenizer = model_dir / "tokenizer.json"
    if tokenizer.is_file():
        from tokenizers import Tokenizer  # lazy: the Rust tokenizer library, needed only for a model directory

        try:
            Tokenizer.from_file(str(tokenizer))
        except Exception as exc:  # noqa: BLE001 - the Rust library raises plain Exceptions for any bad file
            return f"tokenizer.json does not load as a tokenizer ({short_message(exc)})"
    template = model_dir / "chat_template.jinja"
    if template.is_file():
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment  # transformers renders templates in this sandbox

        try:
            ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"]).parse(template.read_text())
        except (OSError, ValueError, TemplateError) as exc:
            return f"chat_template.jinja does not parse as a Jinja template ({short_message(exc)})"
    return None


def check_adapter(adapter_dir: Path, field: str = "--adapter") -> None:
    """A PEFT LoRA adapter directory that loads: both files, a usable ``adapter_config.json``, and an
    ``adapter_model.safetensors`` that is complete and holds LoRA tensors of the rank the config names.

    Read from the config and the safetensors header only (milliseconds). Otherwise an eval worker finds
    out after the model loaded: a truncated file ends in an ActorDiedError traceback, and a config whose
    rank differs from the weights' ends in one that does not even exit.
    """
    from mazerl.policy.loader import ModelLoadError, read_adapter_config  # lazy: it imports torch (seconds)

    try:  # both files there, and the config a LoRA config
        config = read_adapter_config(adapter_dir)
    except ModelLoadError as exc:
        raise InputError(field, f"{field}: {exc}") from None
    fix = (
        "copy the complete adapter directory, its config and weights from one save (a checkpoint's policy/lora_adapter)"
    )
    weights = adapter_dir / "adapter_model.safetensors"
    with open(weights, "rb") as handle:
        header = safetensors_header(handle, weights.stat().st_size)
    if isinstance(header, str):
        raise InputError(
            field, f"{field}={str(adapter_dir)!r} lacks a complete adapter_model.safetensors (it {header}); {fix}"
        )
    problem = lora_rank_problem(config, header)
    if problem:
        raise InputError(field, f"{field}={str(adapter_dir)!r}: {problem}; {fix}")


def lora_rank_problem(config: dict, header: dict) -> str | None:
    """Where a LoRA tensor's rank is none the config names (``r``, or a ``rank_pattern`` value), or None.

    PEFT builds each layer from the config and then copies the weights in: ``lora_A`` is (rank, in),
    ``lora_B`` is (out, rank), so a config from another adapter cannot hold these weights.
    """
    ranks = {config["r"], *(config.get("rank_pattern") or {}).values()}
    for name, entry in header.items():
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if not isinstance(shape, list) or len(shape) < 2:
            continue
        rank = shape[0] if ".lora_A." in name else shape[1] if ".lora_B." in name else None
        if rank is not None and rank not in ranks:
            return (
                f"adapter_config.json names rank r={config['r']}, but adapter_model.safetensors holds {name} of "
                f"shape {shape} (rank {rank}): the config and the weights belong to different adapters"
            )
    return None


def check_starter_copy(root: Path) -> None:
    """A starter already under the data root is checked before it is reused.

    A copy of the shipped starter (its ``starter.json`` names the shipped weights) must hash to the
    pinned digest; a starter built here (``mazerl build-starter``: other weights) must be complete
    and parse. A copy cut short (a full disk, a killed copy) or edited would otherwise be found by
    ``verify_cluster`` 40 s in, or fail a stage's job and be retried.
    """
    starter = paths.models_dir(root) / SHIPPED_NAME
    if not starter.exists():
        return  # copied from the shipped data when the run starts
    fix = f"delete {starter} and run again: the shipped starter is copied there afresh"
    record_path = starter / RECORD_FILE
    try:
        record = json.loads(record_path.read_bytes())
        if not isinstance(record, dict):
            raise ValueError(f"a JSON {type(record).__name__}, not an object")
    except FileNotFoundError:
        raise InputError(
            "data_root", f"the starter copy {starter} has no {RECORD_FILE} (an unfinished copy or build); {fix}"
        ) from None
    except (OSError, ValueError) as exc:
        raise InputError(
            "data_root", f"the starter copy's {record_path} does not parse ({short_message(exc)}); {fix}"
        ) from None
    found = check_model_dir(str(starter))
    damage = f"it lacks {', '.join(found['missing'])}" if found["missing"] else model_file_problem(starter)
    if record.get("weights_sha256") == _shipped_weights_digest():
        actual = directory_digest(starter)
        if actual != SHIPPED_DIGEST:
            damage = f"{damage}; " if damage else ""
            raise InputError(
                "data_root",
                f"the starter copy {starter} is not the shipped starter ({damage}its files hash to "
                f"{actual[:12]}..., not the pinned {SHIPPED_DIGEST[:12]}...); {fix}",
            )
    elif damage:
        raise InputError("data_root", f"the starter {starter} cannot be used ({damage}); {fix}")


def _shipped_weights_digest() -> str | None:
    try:
        return json.loads((SHIPPED_DIR / RECORD_FILE).read_bytes()).get("weights_sha256")
    except (OSError, ValueError, AttributeError):
        return None  # the shipped copy's own check (ensure_starter) reports a missing or broken one
