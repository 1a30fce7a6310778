"""Ray-job entrypoint of the merge stage: ``python -m mazerl.merge.job_entry --config REQUEST``.

The merge needs a whole copy of the base model in memory (about 23 GiB for Qwen3-VL-8B in
bfloat16, :mod:`mazerl.merge.memory`), which a flow-run pod does not have. So the
orchestrator writes the request (JSON: ``base_model``, ``checkpoints_dir``, ``out_dir``,
``probe_eval_set``, ``mlflow_model_dir``, ``max_artifact_mb``, and ``cpus``: torch's threads) and
submits this module as a Ray job asking Ray for that much memory and those CPUs; Ray
starts it on a node that has it (the head or a GPU worker on HyperPod). Here, before loading
anything, the node's real free memory is checked again, then :func:`~mazerl.merge.lora.merge_lora`
merges, proves and writes ``<out_dir>`` with its ``merge_record.json``, then
saves it as an MLflow transformers model in ``<mlflow_model_dir>`` (that also loads the whole
model), which the merge task only uploads.

Exit codes follow the submitter's contract: 0 merged (or already merged), 2 the request cannot
succeed as asked (no adapter, an adapter of another base, a failed proof, not enough memory on
this node: retrying the same request fails the same way), 1 anything else (storage, Ray).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import socket
import sys
import traceback

import torch

from mazerl.merge.lora import MergeError, merge_lora
from mazerl.merge.memory import MergeMemoryError, usable_cpus
from mazerl.policy.loader import load_processor
from mazerl.tracking.mlflow_model import write_mlflow_model

EXIT_OK, EXIT_FAILURE, EXIT_CONFIG_ERROR = 0, 1, 2
REQUEST_KEYS = ("base_model", "checkpoints_dir", "out_dir", "probe_eval_set", "mlflow_model_dir", "max_artifact_mb")
# optional: "cpus", the CPUs the job asked Ray for (entrypoint_num_cpus): its torch threads


def set_threads(asked: int | None) -> str:
    """Torch's threads from what the job was given: the CPUs it asked Ray for, within what this node lets
    it use. (A job driver inherits ``OMP_NUM_THREADS=1`` when it asks for no CPU.)"""
    usable = usable_cpus()
    threads = max(1, min(int(asked), usable)) if asked else torch.get_num_threads()
    torch.set_num_threads(threads)
    given = f"asked Ray for {asked} CPUs" if asked else "asked Ray for no CPUs"
    return f"{threads} torch threads ({given}; {usable} usable here)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="merge request (JSON with " + ", ".join(REQUEST_KEYS) + ")")
    args = parser.parse_args(argv)

    try:
        with open(args.config) as handle:
            request = json.load(handle)
        missing = [key for key in REQUEST_KEYS if key not in request]
        if missing:
            raise ValueError(f"the request lacks {', '.join(missing)}")
    except (OSError, ValueError) as exc:
        print(f"configuration error: cannot use merge request {args.config}: {exc}", flush=True)
        return EXIT_CONFIG_ERROR

    threads = set_threads(request.get("cpus"))
    print(
        f"merge: on {socket.gethostname()} with {threads}: {request['checkpoints_dir']} into {request['base_model']}",
        flush=True,
    )
    try:
        report = merge_lora(
            request["base_model"],
            request["checkpoints_dir"],
            request["out_dir"],
            probe_eval_set=request["probe_eval_set"],
            log=lambda line: print(line, flush=True),
        )
        write_mlflow_model(
            report.merged_dir,
            request["mlflow_model_dir"],
            processor=load_processor(report.merged_dir),
            eval_set=request["probe_eval_set"],
            max_artifact_mb=float(request["max_artifact_mb"]),
            record=dataclasses.asdict(report),
        )
    except (MergeError, MergeMemoryError) as exc:
        print(f"configuration error: {exc}", flush=True)
        return EXIT_CONFIG_ERROR
    except Exception:
        print("merge failed:\n" + traceback.format_exc(), flush=True)
        return EXIT_FAILURE
    print(f"merge done: {report.merged_dir}", flush=True)  # the summary is the merge's own last line above
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
