"""The recipe search's arms as MLflow runs of one experiment (bench/recipe_search.py)."""

import importlib.util
import json
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location(
    "recipe_search", Path(__file__).parents[1] / "bench" / "recipe_search.py"
)
recipe_search = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(recipe_search)


def test_each_arm_and_seed_is_one_mlflow_run_with_its_settings_as_params_kept_across_a_restart(mlflow_root):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{mlflow_root / 'mlflow.db'}"
    overrides = {"grpo": {"credit": "anchor", "progress_reward": 0.0}, "steps": 200}
    config = mlflow_root / "arm" / "seed1.json"
    # Given an arm's first (arm, seed), a run is made in the search's experiment with the settings as params,
    run_id = recipe_search.arm_run(uri, "anchor credit", 1, overrides, config)
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert client.get_experiment(run.info.experiment_id).name == recipe_search.EXPERIMENT
    assert run.info.run_name == "anchor credit seed 1"
    assert run.data.params == {
        "grpo.credit": "anchor",
        "grpo.progress_reward": "0.0",
        "steps": "200",
        "seed": "1",
        "arm": "anchor credit",
    }
    # and a search stopped and started again keeps logging into the run its config names.
    config.parent.mkdir(parents=True)
    config.write_text(json.dumps({"mlflow": {"run_id": run_id}}))
    assert recipe_search.arm_run(uri, "anchor credit", 1, overrides, config) == run_id
    assert len(client.search_runs([run.info.experiment_id])) == 1


def test_an_arms_report_row_gives_its_minutes_first_mistakes_long_mazes_and_cpu(tmp_path):
    """The report's row of one (arm, seed), from its files: the rows are replayed through the real env."""
    from envs.evalset import load as load_eval_set
    from envs.maze import DIRECTIONS, action_text, solve_actions

    eval_set = load_eval_set("maze256-small-v1")
    # Given a finished seed whose last eval fails every fourth maze by walking into a wall from the start
    rows, base = [], []
    for index, layout in enumerate(eval_set.layouts):
        way = solve_actions(layout)
        blocked = next(
            move for move, (dr, dc) in DIRECTIONS.items() if layout.walls[layout.agent[0] + dr, layout.agent[1] + dc]
        )
        fails = index % 4 == 0
        actions = [action_text(blocked)] * eval_set.max_moves if fails else [action_text(a) for a in way]
        rows.append({"index": index, "solved": not fails, "optimal_moves": len(way) - 1, "actions": actions})
        base.append(index % 2 == 0)  # the starter solved the even mazes: every fourth is broken, odd ones fixed
    directory = recipe_search.run_dir(tmp_path, "low temperature", 0)
    (directory / "evals").mkdir(parents=True)
    (directory / "evals" / "step_00300.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    steps = [{"step": step, "train/step_seconds": 6.0} for step in range(1, 301)]
    (directory / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in steps))
    (directory / "search.json").write_text(json.dumps({"wall_seconds": 2100.0, "cpu": "AMD EPYC, AVX-512"}))
    (directory / "train_result.json").write_text("{}")
    # when the report reads it,
    result = recipe_search.arm_result(tmp_path, "low temperature", 0, base)
    # the row has the training minutes, every failure's first mistake, the failures by way length and the CPU.
    assert result["step_seconds"] == 1800.0 and result["wall"] == 2100.0 and result["cpu"] == "AMD EPYC, AVX-512"
    assert result["curve"] == {300: 0.75} and (result["fixed"], result["broken"]) == (128, 64)
    assert result["mistakes"]["into a wall"] == 64 and sum(result["mistakes"].values()) == 64
    lengths = [row["optimal_moves"] for row in rows]
    assert result["failed_by_length"] == {
        n: (sum(1 for r in rows if r["optimal_moves"] == n and not r["solved"]), lengths.count(n)) for n in set(lengths)
    }
    assert sum(failed for failed, _ in result["failed_by_length"].values()) == 64


def test_a_cpu_kind_names_the_instruction_set_that_tells_two_epycs_apart():
    """Two 2-core 'AMD EPYC' hosts replay each other's runs only with the same kernels: AVX-512 or not."""
    from bench.report import cpu_kind

    def cpuinfo(family: int, model: int, flags: str) -> str:
        return "".join(
            f"processor\t: {n}\nmodel name\t: AMD EPYC\ncpu family\t: {family}\nmodel\t\t: {model}\n"
            f"flags\t\t: fpu sse2 {flags} avx2\n\n"
            for n in range(2)
        )

    assert cpu_kind(cpuinfo(25, 1, "")) == "AMD EPYC, family 25 model 1, no AVX-512"
    assert cpu_kind(cpuinfo(25, 17, "avx512f avx512bw")) == "AMD EPYC, family 25 model 17, AVX-512"
    assert cpu_kind(cpuinfo(26, 2, "avx512_bf16")) == "AMD EPYC, family 26 model 2, no AVX-512"  # avx512f itself
