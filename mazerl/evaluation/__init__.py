"""The eval stage: greedy play of a fixed eval set over Ray workers, results and summary files, GIFs."""

from mazerl.evaluation.evaluate import EvalReport, evaluate

__all__ = ["EvalReport", "evaluate"]
