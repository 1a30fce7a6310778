"""Recipe search on 2 cores: training arms one after another, each over several seeds, judged on
every held-out maze at fixed steps.

    # run the arms of a JSON file ({"arm name": {training overrides}, ...}) over seeds 0 and 1
    python bench/recipe_search.py train --arms bench/arms.json --model DIR --root /tmp/search --seeds 0 1
    # the table: greedy success at every eval step per seed, fixed / broken and McNemar at the last
    python bench/recipe_search.py report --arms bench/arms.json --model DIR --root /tmp/search --seeds 0 1

Why one after another: two training processes side by side on 2 cores made each 3-10x slower
and got arms stopped before they said anything. Each arm's overrides go over the embedded recipe
(``mazerl.training.recipes.EMBEDDED_TRAINING``) as ``--training`` does, and every eval plays all 256
mazes (``learning_result.JUDGED_ON_ALL``); ``eval_interval`` should stay as the recipe has it so every
arm is judged on the same mazes at the same steps. A finished (arm, seed) is skipped when ``train`` runs again, so a
search that was stopped continues where it was.

The report gives, per (arm, seed): the greedy curve, fixed / broken against the starter with the
exact McNemar p, the training minutes (the steps' own; with the periodic evals), the failure kinds
and where each failure began (``mazerl.evaluation.failures``), the failures by length of the
shortest way (the 12-move mazes are the last ones left), and the CPU it trained on
(``bench.report.cpu_kind``: two EPYC kinds round the same seed differently). What a trained
adapter reads of the walls: ``python bench/wall_probe.py --model DIR --adapter
ARM=ROOT/ARM/runs/seed0/checkpoints/global_step_300/policy/lora_adapter``.
Each (arm, seed) is an MLflow run of the experiment ``recipe-search`` (the arm's settings its params,
the trainer's steps and greedy evals its metrics): ``mlflow ui --backend-store-uri sqlite:///ROOT/mlflow.db``
shows the arms side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.learning_result import JUDGED_ON_ALL, baseline_rows, kinds_of, mistakes_of  # noqa: E402
from bench.report import this_cpu  # noqa: E402
from mazerl.eval_files import read_result_rows  # noqa: E402
from mazerl.evaluation.failures import MISTAKES  # noqa: E402
from mazerl.tracking.curves import history_from_jsonl  # noqa: E402

EXPERIMENT = "recipe-search"  # one MLflow experiment: each (arm, seed) a run


def arm_root(root: Path, arm: str) -> Path:
    return root / arm.replace(" ", "_")


def run_dir(root: Path, arm: str, seed: int) -> Path:
    return arm_root(root, arm) / "runs" / f"seed{seed}"


def train(args: argparse.Namespace, arms: dict[str, dict]) -> None:
    from mlflow.tracking import MlflowClient

    from mazerl.training.config import TrainConfig, save_config
    from mazerl.training.recipes import EMBEDDED_TRAINING, deep_merge

    for arm, overrides in arms.items():
        for seed in args.seeds:
            directory = run_dir(args.root, arm, seed)
            if (directory / "train_result.json").is_file():
                print(f"{arm} seed {seed}: done already, skipped", flush=True)
                continue
            uri = f"sqlite:///{args.root}/mlflow.db"
            path = arm_root(args.root, arm) / f"seed{seed}.json"
            values = (
                deep_merge(EMBEDDED_TRAINING, overrides)
                | JUDGED_ON_ALL
                | {
                    "run_id": f"seed{seed}",
                    "seed": seed,
                    "data_root": str(arm_root(args.root, arm)),
                    "base_model": str(args.model),
                    "eval_set": "maze256-small-v1",
                    "mlflow": {
                        "tracking_uri": uri,
                        "experiment": EXPERIMENT,
                        "run_id": arm_run(uri, arm, seed, overrides, path),
                    },
                }
            )
            config = TrainConfig.model_validate(values)
            path = save_config(config, path)
            print(f"{arm} seed {seed}: training ({json.dumps(overrides)})", flush=True)
            load = [os.getloadavg()[0]]
            started = time.perf_counter()
            subprocess.run([sys.executable, "-m", "mazerl.training.local_entry", "--config", str(path)], check=True)
            load.append(os.getloadavg()[0])
            (directory / "search.json").write_text(
                json.dumps({"load": load, "wall_seconds": time.perf_counter() - started, "cpu": this_cpu()})
            )
            MlflowClient(uri).set_terminated(config.mlflow.run_id, "FINISHED")


def arm_run(uri: str, arm: str, seed: int, overrides: dict, config_path: Path) -> str:
    """The MLflow run of (arm, seed) in the experiment ``recipe-search``: the one an earlier, stopped
    search made (its config names it), else a new one with the arm's settings as params, so that a
    user compares arms side by side in the MLflow UI (the trainer logs every step and greedy eval into it)."""
    from mlflow.entities import Param
    from mlflow.tracking import MlflowClient

    if config_path.is_file():
        return json.loads(config_path.read_text())["mlflow"]["run_id"]
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(EXPERIMENT)
    run = client.create_run(experiment_id, run_name=f"{arm} seed {seed}", tags={"arm": arm, "seed": str(seed)})
    settings = flat(overrides) | {"seed": seed, "arm": arm}
    client.log_batch(run.info.run_id, params=[Param(key, str(value)[:500]) for key, value in settings.items()])
    return run.info.run_id


def flat(values: dict, prefix: str = "") -> dict:
    """Nested overrides as ``grpo.credit``-style keys."""
    out = {}
    for key, value in values.items():
        out |= flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value}
    return out


def mcnemar(solved: list[bool], base: list[bool]) -> tuple[int, int, float]:
    from mazerl.evaluation.summary import exact_mcnemar_p

    fixed = sum(s and not b for s, b in zip(solved, base, strict=True))
    broken = sum(b and not s for s, b in zip(solved, base, strict=True))
    return fixed, broken, exact_mcnemar_p(fixed, broken)


def arm_result(root: Path, arm: str, seed: int, base: list[bool]) -> dict | None:
    directory = run_dir(root, arm, seed)
    evals = sorted((directory / "evals").glob("step_*.jsonl"))
    if not evals:
        return None
    rows_by_step = {
        int(path.stem.split("_")[1]): sorted(read_result_rows(path), key=lambda r: r["index"]) for path in evals
    }
    curve = {step: [bool(r["solved"]) for r in rows] for step, rows in rows_by_step.items()}
    last = max(curve)
    fixed, broken, p = mcnemar(curve[last], base)
    info = json.loads((directory / "search.json").read_text()) if (directory / "search.json").is_file() else {}
    final_rows = rows_by_step[last]
    steps = history_from_jsonl(directory / "metrics.jsonl", ("train/step_seconds",))["train/step_seconds"]
    return {
        "curve": {step: sum(solved) / len(solved) for step, solved in curve.items()},
        "last": last,
        "fixed": fixed,
        "broken": broken,
        "p": p,
        "step_seconds": sum(seconds for _, seconds in steps),
        "wall": info.get("wall_seconds"),
        "cpu": info.get("cpu", ""),
        "kinds": kinds_of(final_rows),
        "mistakes": mistakes_of(final_rows),
        "failed_by_length": failed_by_length(final_rows),
        "complete": (directory / "train_result.json").is_file(),
    }


def failed_by_length(rows: list[dict]) -> dict[int, tuple[int, int]]:
    """{shortest way in moves: (failed, mazes)}: the long ways round (12 moves and more in a
    15-move budget) are where a wrong branch cannot be undone."""
    mazes = Counter(row["optimal_moves"] for row in rows)
    failed = Counter(row["optimal_moves"] for row in rows if not row["solved"])
    return {length: (failed[length], mazes[length]) for length in sorted(mazes)}


def report(args: argparse.Namespace, arms: dict[str, dict]) -> str:
    base_rows = baseline_rows(args.model, args.root / "baseline_rows.jsonl")
    base = [bool(r["solved"]) for r in sorted(base_rows, key=lambda r: r["index"])]
    baseline = sum(base) / len(base)
    lines = [
        f"Baseline (the starter, greedy, all 256 held-out mazes): {baseline:.1%}.",
        "",
        "| arm | overrides over the embedded recipe | seed | greedy success by step | fixed / broken | "
        "McNemar p | training min (steps; with evals) | wall bumps / loops | first mistake: "
        + " / ".join(MISTAKES)
        + " | failed / mazes by shortest way (moves) | CPU |",
        "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | --- | --- | --- |",
    ]
    for arm, overrides in arms.items():
        finals = []
        for seed in args.seeds:
            result = arm_result(args.root, arm, seed, base)
            if result is None:
                continue
            curve = " / ".join(f"{step}: {value:.1%}" for step, value in sorted(result["curve"].items()))
            minutes = f"{result['step_seconds'] / 60:.1f}" + (f"; {result['wall'] / 60:.1f}" if result["wall"] else "")
            status = "" if result["complete"] else " (stopped)"
            kinds = result["kinds"]
            mistakes = " / ".join(str(result["mistakes"][mistake]) for mistake in MISTAKES)
            lengths = ", ".join(
                f"{moves}: {failed}/{total}" for moves, (failed, total) in result["failed_by_length"].items()
            )
            lines.append(
                f"| {arm}{status} | `{json.dumps(overrides)}` | {seed} | {curve} | {result['fixed']} / "
                f"{result['broken']} | {result['p']:.1g} | {minutes} | {kinds['wall bumps']} / {kinds['loop']} | "
                f"{mistakes} | {lengths} | {result['cpu']} |"
            )
            finals.append(result["curve"][result["last"]])
        if len(finals) > 1:
            lines.append(
                f"| {arm}: mean | | | {statistics.mean(finals):.1%} (range {min(finals):.1%}-{max(finals):.1%}) "
                "| | | | | | | |"
            )
    body = "\n".join(lines)
    print(body)
    return body


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("train", "report"))
    parser.add_argument("--arms", type=Path, required=True, help='JSON file: {"arm": {training overrides}}')
    parser.add_argument("--model", type=Path, required=True, help="the starter directory")
    parser.add_argument("--root", type=Path, required=True, help="where the arms' runs go")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--only", nargs="*", help="run or report only these arms")
    args = parser.parse_args()
    args.root, args.model = args.root.resolve(), args.model.resolve()
    arms = json.loads(args.arms.read_text())
    if args.only:
        unknown = sorted(set(args.only) - set(arms))
        if unknown:
            parser.error(f"--only names arms not in {args.arms}: {unknown}")
        arms = {name: arms[name] for name in args.only}
    train(args, arms) if args.command == "train" else report(args, arms)


if __name__ == "__main__":
    main()
