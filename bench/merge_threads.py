"""The merge job's work (merge_lora + the MLflow model) on a Qwen3-VL-shaped model, with 1 torch thread and with 2.

    python bench/merge_threads.py [--layers 16] [--hidden 1024] [--threads 1 2]

Why: a Ray job driver that asks for no CPU inherits ``OMP_NUM_THREADS=1``, so the merge of the
8B model (bf16 CPU forward passes for the proofs, a reload, the MLflow save) ran on one core of
the HyperPod head. The merge job now asks Ray for CPUs (``entrypoint_num_cpus``, at most
``mazerl.merge.memory.MAX_MERGE_CPUS``) and sets torch's threads from them; this measures what
threads buy.

The model is built here, never downloaded: the starter's tokenizer, processor and vision tower
(patch 16) under a Qwen3-VL language model of ``--layers`` blocks of width ``--hidden`` (GQA,
head_dim 64), Qwen3-VL's vocabulary of 151,936 and untied embeddings, random weights stored in
bfloat16 as the releases are; about 0.5 B parameters at the defaults. A rank-32 LoRA adapter on
the seven projections (random non-zero deltas) sits in a checkpoint of the layout both backends
write. Each thread count runs in a fresh process (``--run``) and does exactly what
``mazerl.merge.job_entry`` does: ``set_threads``, ``merge_lora`` (load, probe logits, merge, proofs,
save, reload), ``write_mlflow_model``. The 8B extrapolation scales each phase with the parameter count
and splits it by Amdahl's law from the measured 1-to-2-thread speed-up. Writes its section of
docs/performance.md. The machine is shared: the load average is printed beside the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))

from bench.report import write_section  # noqa: E402

QWEN3_VL_VOCAB = 151_936
QWEN3_VL_8B_PARAMETERS = 8.77e9  # Qwen3-VL-8B-Instruct: 16.3 GiB of bf16 weights (17.5 GB)
HEAD_THREADS = (16, 52)  # what the merge job asks for on the HyperPod head (MAX_MERGE_CPUS), and all its CPUs
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def build(work: Path, layers: int, hidden: int) -> tuple[Path, Path, int]:
    """(base model dir, checkpoints dir, parameters): a Qwen3-VL-shaped model and a LoRA checkpoint of it."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, Qwen3VLForConditionalGeneration

    from mazerl.fingerprint import model_fingerprint
    from mazerl.starter.shipped import shipped_starter
    from mazerl.training import checkpoints

    starter = shipped_starter()
    base = work / "base"
    shutil.copytree(starter, base, ignore=shutil.ignore_patterns("*.safetensors", "starter.json"))
    config = AutoConfig.from_pretrained(starter)
    text = config.text_config
    text.hidden_size, text.intermediate_size, text.num_hidden_layers = hidden, 3 * hidden, layers
    text.head_dim = 64
    text.num_attention_heads, text.num_key_value_heads = hidden // 64, hidden // 128
    text.vocab_size = QWEN3_VL_VOCAB
    text.rope_parameters["mrope_section"] = [16, 8, 8]  # head_dim / 2, split as the 8B's [24, 20, 20] is for 128
    config.vision_config.out_hidden_size = hidden
    torch.manual_seed(0)
    model = Qwen3VLForConditionalGeneration(config).to(torch.bfloat16)
    parameters = sum(p.numel() for p in model.parameters())
    model.save_pretrained(base, safe_serialization=True)
    del model

    model = Qwen3VLForConditionalGeneration.from_pretrained(base, dtype=torch.bfloat16)
    peft_model = get_peft_model(model, LoraConfig(r=32, lora_alpha=64, target_modules=list(TARGETS)))
    generator = torch.Generator().manual_seed(7)
    for name, parameter in peft_model.named_parameters():
        if "lora_B" in name:
            parameter.data = (torch.randn(parameter.shape, generator=generator) * 0.01).to(parameter.dtype)
    adapter = work / "adapter"
    peft_model.save_pretrained(str(adapter), safe_serialization=True)
    del peft_model, model
    fingerprint = model_fingerprint(base)

    def write(path: Path) -> None:
        shutil.copytree(adapter, path / checkpoints.ADAPTER_SUBDIR)
        checkpoints.save_trainer_state(path, {"global_step": 1, "base_model_fingerprint": fingerprint})

    checkpoints.save(work / "checkpoints", 1, write, keep=1)
    return base, work / "checkpoints", parameters


def run_once(work: Path, threads: int) -> dict:
    """In this process: the merge job's work with ``threads`` torch threads; seconds per phase."""
    from mazerl.merge.job_entry import set_threads
    from mazerl.merge.lora import merge_lora
    from mazerl.policy.loader import load_processor
    from mazerl.tracking.mlflow_model import write_mlflow_model

    said = set_threads(threads)
    stamps: list[tuple[float, str]] = []
    started, cpu_started = time.perf_counter(), time.process_time()
    report = merge_lora(
        work / "base",
        work / "checkpoints",
        work / f"merged-{threads}",
        probe_eval_set="maze256-small-v1",
        log=lambda line: stamps.append((time.perf_counter() - started, line)),
    )
    merged_s = time.perf_counter() - started
    write_mlflow_model(
        report.merged_dir,
        work / f"mlflow-{threads}",
        processor=load_processor(report.merged_dir),
        eval_set="maze256-small-v1",
        max_artifact_mb=1e9,  # the weights inside, as below the artifact limit
    )
    total = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    loaded = next(t for t, line in stamps if "loaded" in line)
    proved = next(t for t, line in stamps if "LoRA modules" in line)
    return {
        "threads": threads,
        "said": said,
        "load_and_probe_s": round(loaded, 1),
        "adapter_merge_and_proofs_s": round(proved - loaded, 1),
        "save_and_reload_s": round(merged_s - proved, 1),
        "mlflow_model_s": round(total - merged_s, 1),
        "total_s": round(total, 1),
        "cpu_s": round(cpu, 1),  # CPU seconds of all threads: what a loaded machine cannot inflate
    }


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--run", type=Path, help=argparse.SUPPRESS)  # internal: one measurement in this process
    args = parser.parse_args()
    if args.run is not None:
        print(json.dumps(run_once(args.run, args.threads[0])))
        return

    with tempfile.TemporaryDirectory(prefix="mazerl-merge-bench-") as scratch:
        work = Path(scratch)
        built = time.perf_counter()
        _, _, parameters = build(work, args.layers, args.hidden)
        print(f"built a {parameters / 1e9:.2f} B-parameter model in {time.perf_counter() - built:.0f} s", flush=True)
        rows = []
        for threads in args.threads:
            before = load_average()
            out = subprocess.run(
                [sys.executable, __file__, "--run", str(work), "--threads", str(threads)],
                check=True,
                capture_output=True,
                text=True,
                # what a Ray job driver that asks for no CPU gets; no progress bars in the measurement
                env=os.environ | {"OMP_NUM_THREADS": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"},
            )
            row = json.loads(out.stdout.strip().splitlines()[-1]) | {
                "load_before": before,
                "load_after": load_average(),
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
        weights_gib = sum(p.stat().st_size for p in (work / "base").glob("*.safetensors")) / 2**30
    write_section("merge_threads", section(rows, parameters, weights_gib))


def section(rows: list[dict], parameters: int, weights_gib: float) -> str:
    phases = ("load_and_probe_s", "adapter_merge_and_proofs_s", "save_and_reload_s", "mlflow_model_s", "total_s")
    one, two = rows[0], rows[-1]
    scale = QWEN3_VL_8B_PARAMETERS / parameters
    speedup = one["total_s"] / two["total_s"]
    parallel = min(1.0, max(0.0, 2 * (1 - two["total_s"] / one["total_s"])))  # Amdahl: t2 = t1 (1 - p + p/2)
    lines = [
        "## LoRA merge: threads",
        "",
        f"The merge job's work (`merge_lora`: load, probe logits, merge, proofs, save, reload; then the MLflow model)"
        f" on a Qwen3-VL-shaped model built locally: {parameters / 1e9:.2f} B parameters ({weights_gib:.2f} GiB of"
        " bf16 weights; Qwen3-VL's vocabulary, the starter's vision tower), a rank-32 adapter on the seven"
        " projections. One fresh process per thread count, `OMP_NUM_THREADS=1` as a Ray job driver that asks for no"
        " CPU gets, then `set_threads` as the merge job calls it.",
        "",
        "| threads | load + probe | merge + proofs | save + reload | MLflow model | total | CPU seconds | load average before / after |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for row in rows:
        cells = " | ".join(f"{row[p]:.1f} s" for p in phases)
        lines.append(
            f"| {row['threads']} | {cells} | {row['cpu_s']:.1f} | {row['load_before']} / {row['load_after']} |"
        )
    # one thread's CPU seconds stand for its uncontended time (a loaded machine stretches the wall clock, not them)
    single = one["cpu_s"]
    estimates = " ".join(
        f"{n} thread{'s' if n > 1 else ''} ~{scale * single * ((1 - parallel) + parallel / n) / 60:.0f} min;"
        for n in (1, *HEAD_THREADS)
    )
    lines += [
        "",
        f"Speed-up from 1 to 2 threads (wall clock): {speedup:.2f}x, i.e. a parallel share of {parallel:.0%} by"
        " Amdahl's law (t2 = t1 (1 - p + p/2)). **Extrapolation to Qwen3-VL-8B on the HyperPod head** (one"
        f" thread's {single:.0f} CPU seconds as its uncontended time, every phase scaled with the parameter count,"
        f" x{scale:.1f}; the serial share stays): {estimates.rstrip(';')}. The job asks for"
        " `MAX_MERGE_CPUS` = 16. Caveats: this machine is shared and was loaded (load averages above), so the"
        " 2-thread number is pessimistic and the parallel share a lower bound; the head's cores and memory"
        " bandwidth differ from these; writes to FSx instead of a local disk make save and MLflow phases slower and"
        " do not scale with threads.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
