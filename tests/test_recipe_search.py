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
