"""Ray-job entrypoint of the eval stage: ``python -m mazerl.evaluation.job_entry --config REQUEST``.

The orchestrator writes the request (:func:`mazerl.evaluation.settings.eval_request`: the model,
the report's directory and the :class:`~mazerl.evaluation.settings.EvalSettings`) as JSON and
submits this module as a Ray job,
so the eval's workers run on the cluster, next to the model files, whatever machine the
orchestrator is on. Exit codes follow the submitter's contract: 0 done, 2 bad request
(not retried), 1 anything else.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

from envs.evalset import EvalSetError
from mazerl.evaluation.evaluate import evaluate
from mazerl.evaluation.settings import read_eval_request
from mazerl.policy.loader import ModelLoadError
from mazerl.progress import ProgressMeter

EXIT_OK, EXIT_FAILURE, EXIT_CONFIG_ERROR = 0, 1, 2
PROGRESS_EVERY_S = 10.0  # progress lines of a long eval: often enough to see it move, rarely enough to read


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True, help="eval request (JSON: settings.eval_request())")
    args = parser.parse_args(argv)

    try:
        with open(args.config) as handle:
            request = read_eval_request(json.load(handle))
    except (OSError, json.JSONDecodeError, ValueError, TypeError) as exc:
        print(f"configuration error: cannot read eval request {args.config}: {exc}", flush=True)
        return EXIT_CONFIG_ERROR

    meters: list[ProgressMeter] = []  # started when the workers have loaded the policy (done 0)
    last_line = [0.0]

    def progress(done: int, total: int) -> None:
        """A line at the start, at the end, and at most every PROGRESS_EVERY_S in between: counts by the maze."""
        if not meters:
            meters.append(ProgressMeter(total, "maze"))
        elif done < total and time.monotonic() - last_line[0] < PROGRESS_EVERY_S:
            return
        last_line[0] = time.monotonic()
        print(f"eval: {meters[0].text(done)}", flush=True)

    try:
        report = evaluate(**request, ray_address="auto", progress=progress)
    except (EvalSetError, ModelLoadError, TypeError, ValueError) as exc:
        print(f"configuration error: {exc}", flush=True)
        return EXIT_CONFIG_ERROR
    except Exception:
        print("eval failed:\n" + traceback.format_exc(), flush=True)
        return EXIT_FAILURE
    print(
        f"eval done: {report.solved}/{report.n} solved ({report.success_rate:.1%}, 95% CI "
        f"{report.success_ci95[0]:.1%}-{report.success_ci95[1]:.1%}), ceiling {report.budget_ceiling:.1%}, "
        f"{report.wall_seconds:.0f}s -> {report.summary_path}",
        flush=True,
    )
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
