"""The eval stage's inference engines, and the GPUs one eval worker of each asks Ray for.

The one home of the rule "vLLM gets 1 GPU per worker by default" (vLLM runs on GPUs only; the HF
engine runs on CPU, or on a GPU it is given): the pipeline's parameters
(``PipelineParams.resolved_eval_gpus``) and :func:`mazerl.evaluation.evaluate` both call
:func:`gpus_per_worker`, and both refuse what Ray or vLLM cannot do with :func:`check_gpus_per_worker`.
Plain Python (no torch), so the parameters can use it.
"""

from __future__ import annotations

import typing
from typing import Literal

EvalEngine = Literal["hf", "vllm"]
ENGINES: tuple[str, ...] = typing.get_args(EvalEngine)
DEFAULT_GPUS_PER_WORKER: dict[str, float] = {"hf": 0.0, "vllm": 1.0}


def gpus_per_worker(engine: str, asked: float | None = None) -> float:
    """``asked``, or the engine's default when None: 1 GPU per vLLM worker, none for hf."""
    return float(asked) if asked is not None else DEFAULT_GPUS_PER_WORKER.get(engine, 0.0)


def check_gpus_per_worker(engine: str, gpus: float) -> None:
    """A ValueError naming the parameter and the fix unless an ``engine`` worker can run on ``gpus``."""
    if engine == "vllm" and gpus <= 0:
        raise ValueError(
            f"eval_gpus_per_worker ({gpus:g}) with eval_engine 'vllm': vLLM runs on GPUs only; give each worker a "
            "GPU (eval_gpus_per_worker: 1) or use eval_engine 'hf'"
        )
    if gpus > 1 and not float(gpus).is_integer():
        raise ValueError(
            f"eval_gpus_per_worker ({gpus:g}) above 1 must be a whole number (Ray gives whole GPUs beyond one); "
            "e.g. 1 or 2"
        )
