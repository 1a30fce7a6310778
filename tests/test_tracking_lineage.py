"""MLflow lineage on a real SQLite store: parent and stage runs, re-attach, params, eval set and reports."""

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from pydantic import BaseModel

from envs.evalset import EvalSetError, path_for
from envs.render import episode_gif
from mazerl import paths
from mazerl.tracking import evals, lineage, params, store
from mazerl.tracking.evals import EvalReportError
from mazerl.tracking.lineage import STAGES
from mazerl.tracking.params import LineageError


def client_of(uri):
    return MlflowClient(tracking_uri=uri)


@pytest.fixture
def uri(mlflow_root):
    return paths.mlflow_db_uri(mlflow_root)


def all_runs(uri, experiment_id):
    return client_of(uri).search_runs([experiment_id], max_results=1000)


def test_pipeline_run_is_a_parent_whose_stage_runs_start_with_their_stages(uri, mlflow_root):
    # given an empty store / when a pipeline run starts
    runs = lineage.start_pipeline_run(
        uri,
        "vlm-maze-grpo",
        "ruddy-gerbil-8432ca63",
        tags={"owner": "ci", "mazerl.run_id": "ruddy-gerbil-8432ca63"},
        params={"steps": 3},
        flow_run_id="flow-1",
        deployment="local",
    )
    client = client_of(uri)
    # then the parent is named by the run id and carries the Prefect ids and the repository's commit
    parent = client.get_run(runs.parent_run_id)
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent)
    assert parent.info.run_name == "ruddy-gerbil-8432ca63"
    assert parent.data.tags["prefect.flow_run_id"] == "flow-1"
    assert parent.data.tags["prefect.deployment"] == "local"
    assert parent.data.tags["mlflow.source.git.commit"] == head.stdout.strip(), "parent should record HEAD"
    assert parent.data.tags["owner"] == "ci"
    assert parent.data.params == {"steps": "3"}
    # and no stage run exists before its stage starts (MLflow cannot move a run's start time later)
    assert runs.stage_run_ids == {} and len(all_runs(uri, runs.experiment_id)) == 1
    # when the stages run one after the other
    spans = {}
    for stage in STAGES:
        time.sleep(0.05)
        with lineage.stage_run(uri, runs.run_id(stage)):
            time.sleep(0.05)
        info = client.get_run(runs.run_id(stage)).info
        spans[stage] = (info.start_time, info.end_time)
    # then each stage run is a child named after its stage, spanning its own stage only
    for earlier, later in zip(STAGES, STAGES[1:], strict=False):
        assert spans[earlier][1] <= spans[later][0], f"{earlier} {spans[earlier]} must end before {later} starts"
    for stage in STAGES:
        child = client.get_run(runs.run_id(stage))
        assert child.info.run_name == stage and child.info.status == "FINISHED"
        assert child.data.tags["mlflow.parentRunId"] == runs.parent_run_id
        assert child.data.tags["mazerl.run_id"] == "ruddy-gerbil-8432ca63" and child.data.tags["prefect.flow_run_id"]
        assert spans[stage][1] - spans[stage][0] < 2000, f"{stage} lasted {spans[stage]} ms, not the pipeline's"
        assert spans[stage][0] > parent.info.start_time
    # and the experiment is MLflow's model-training kind and keeps its artifacts under <root>/mlartifacts
    experiment = client.get_experiment(runs.experiment_id)
    assert experiment.name == "vlm-maze-grpo"
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    view = json.loads(experiment.tags["mlflow.sharedViewState.mazerl"])  # the runs table's columns
    assert "metrics.`final_pct`" in view["selectedColumns"]
    # and the stage runs sort top-down in pipeline order under a descending sort of their key, after their parent
    assert view["orderByKey"] == "tags.`mazerl.sort_key`" and view["orderByAsc"] is False
    keys = [parent.data.tags["mazerl.sort_key"]]
    keys += [client.get_run(runs.run_id(stage)).data.tags["mazerl.sort_key"] for stage in lineage.STAGES]
    assert keys == sorted(keys, reverse=True), keys
    assert experiment.artifact_location == (mlflow_root / "mlartifacts").as_uri()
    # and the run id the train task hands its Ray job (MLFLOW_RUN_ID, tasks/training.py) is the train child's
    train = client.get_run(lineage.stage_run_id(uri, runs.parent_run_id, "train"))
    assert train.info.run_id == runs.run_id("train") and train.data.tags["mazerl.stage"] == "train"


def test_an_existing_experiment_gets_the_model_training_kind_unless_it_has_one(uri):
    client = client_of(uri)
    untyped = client.create_experiment("old")
    chosen = client.create_experiment("chosen", tags={"mlflow.experimentKind": "genai_development"})
    assert store.ensure_experiment(uri, "old") == untyped
    store.ensure_experiment(uri, "chosen")
    assert client.get_experiment(untyped).tags["mlflow.experimentKind"] == "custom_model_development"
    assert client.get_experiment(chosen).tags["mlflow.experimentKind"] == "genai_development", "a user's choice stays"


def test_ui_links_open_the_model_training_view():
    # MLflow 3.17's UI opens every experiment on its GenAI overview unless the URL says otherwise.
    assert store.experiment_url("http://127.0.0.1:5000/", "3", "abc") == (
        "http://127.0.0.1:5000/#/experiments/3/runs/abc?workflowType=machine_learning"
    )
    assert store.experiment_url("https://mlflow.example", "3") == (
        "https://mlflow.example/#/experiments/3/runs?viewStateShareKey=mazerl&workflowType=machine_learning"
    )
    assert store.ui_url("sqlite:////x/mlflow.db") == "http://127.0.0.1:5000"
    assert store.ui_url("https://mlflow.example/") == "https://mlflow.example"
    assert store.ui_url("databricks") is None
    assert store.ui_url("arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/m") is None  # Studio's


def test_retried_flow_run_reattaches_to_its_runs(uri):
    # given a pipeline run whose flow failed half-way, in train
    first = lineage.start_pipeline_run(uri, params={"steps": 3}, flow_run_id="flow-2")
    with lineage.stage_run(uri, first.run_id("verify_cluster")):
        pass
    train = first.run_id("train")
    with pytest.raises(RuntimeError), lineage.stage_run(uri, train):
        raise RuntimeError("node lost")
    failed = client_of(uri).get_run(train).info
    assert client_of(uri).get_run(first.parent_run_id).info.status == "FAILED", "a failed stage fails the parent"
    # when the flow run is retried (same flow-run id, same params) and train runs again
    again = lineage.start_pipeline_run(uri, params={"steps": 3}, flow_run_id="flow-2")
    assert again.reattached and not first.reattached
    assert again.parent_run_id == first.parent_run_id
    assert again.stage_run_ids == {"verify_cluster": first.run_id("verify_cluster"), "train": train}
    assert client_of(uri).get_run(again.parent_run_id).info.status == "RUNNING"
    time.sleep(0.05)
    with lineage.stage_run(uri, again.run_id("train")):
        pass
    # then the same stage run spans both attempts: the first one's start, the retry's end
    retried = client_of(uri).get_run(train).info
    assert retried.status == "FINISHED" and retried.start_time == failed.start_time
    assert retried.end_time > failed.end_time
    assert len(all_runs(uri, again.experiment_id)) == 3, "no stage run is duplicated"
    # and another flow run gets runs of its own
    other = lineage.start_pipeline_run(uri, flow_run_id="flow-3")
    assert other.parent_run_id != first.parent_run_id and not other.reattached
    assert other.run_id("train") != train


def test_retry_with_changed_params_is_refused(uri):
    first = lineage.start_pipeline_run(uri, params={"training": {"steps": 3}}, flow_run_id="flow-4")
    with pytest.raises(LineageError, match=r"training\.steps: logged '3', now '5'"):
        lineage.start_pipeline_run(uri, params={"training": {"steps": 5}}, flow_run_id="flow-4")
    assert client_of(uri).get_run(first.parent_run_id).data.params["training.steps"] == "3"


def test_stage_run_marks_finished_or_failed(uri):
    runs = lineage.start_pipeline_run(uri)
    with lineage.stage_run(uri, runs.run_id("verify_cluster")):
        assert client_of(uri).get_run(runs.run_id("verify_cluster")).info.status == "RUNNING"
    with pytest.raises(RuntimeError, match="boom"), lineage.stage_run(uri, runs.run_id("train")):
        raise RuntimeError("boom")
    assert client_of(uri).get_run(runs.run_id("verify_cluster")).info.status == "FINISHED"
    failed = client_of(uri).get_run(runs.run_id("train")).info
    assert failed.status == "FAILED" and failed.end_time is not None
    with pytest.raises(ValueError, match="status='DONE'"):
        lineage.set_run_status(uri, runs.run_id("train"), "done")


class Inner(BaseModel):
    rank: int = 32
    target_modules: tuple[str, ...] = ("q_proj", "v_proj")


class Outer(BaseModel):
    lora: Inner = Inner()
    name: str = "run"


@dataclass
class Holder:
    path: Path
    nested: dict


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (Outer(), {"lora.rank": "32", "lora.target_modules": '["q_proj", "v_proj"]', "name": "run"}),
        ({"a": {"b": {"c": 1}}, "d": None, "e": True}, {"a.b.c": "1", "d": "None", "e": "True"}),
        (Holder(Path("/x/y"), {"k": 1.5}), {"path": "/x/y", "nested.k": "1.5"}),
        ({"stages": [{"name": "train"}, {"name": "eval"}]}, {"stages.0.name": "train", "stages.1.name": "eval"}),
        ({"weird key!": 1, "empty": {}}, {"weird key_": "1", "empty": "{}"}),
    ],
)
def test_flatten_params(values, expected):
    assert params.flatten_params(values) == expected


def test_flatten_params_truncates_to_mlflow_limits():
    flat = params.flatten_params({"long": "x" * 10_000, "k" * 300: 1})
    assert len(flat["long"]) == 6000 and flat["long"].endswith("...[truncated]")
    assert max(len(key) for key in flat) == 250


def test_eval_set_is_logged_as_dataset_input_with_digest(uri):
    runs = lineage.start_pipeline_run(uri)
    run_id = runs.run_id("baseline_eval")
    digest = evals.log_eval_set(uri, run_id, "maze256-small-v1")
    run = client_of(uri).get_run(run_id)
    [dataset_input] = run.inputs.dataset_inputs
    tags = {tag.key: tag.value for tag in dataset_input.tags}
    stored = json.loads(path_for("maze256-small-v1").read_text())["sha256"]
    assert digest == stored
    assert dataset_input.dataset.name == "maze256-small-v1"
    assert dataset_input.dataset.digest == stored[:36], "MLflow keeps at most 36 digest characters"
    assert tags == {"mlflow.data.context": "eval", "mazerl.sha256": stored}
    assert json.loads(dataset_input.dataset.profile)["num_rows"] == 256
    assert run.data.tags["mazerl.eval_set.sha256"] == stored


def test_tampered_eval_set_fails_with_the_digest_error(uri, tmp_path):
    content = json.loads(path_for("maze256-small-v1").read_text())
    content["seeds"][0] += 1
    tampered = tmp_path / "maze256-small-v1.json"
    tampered.write_text(json.dumps(content))
    runs = lineage.start_pipeline_run(uri)
    with pytest.raises(EvalSetError, match="was edited"):
        evals.log_eval_set(uri, runs.run_id("baseline_eval"), tampered)
    assert client_of(uri).get_run(runs.run_id("baseline_eval")).inputs.dataset_inputs == []


def write_eval_dir(path: Path, rows, summary) -> Path:
    path.mkdir(parents=True)
    (path / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (path / "summary.json").write_text(json.dumps(summary))
    frame = np.zeros((16, 16, 3), dtype=np.uint8)
    episode_gif([frame, frame + 255], path / "gifs" / "maze-0-solved.gif")
    return path


ROWS = [
    {
        "index": 0,
        "maze_id": "s/0",
        "solved": True,
        "moves": 5,
        "optimal_moves": 4,
        "parse_failures": 0,
        "actions": ["a"],
    },
    {
        "index": 1,
        "maze_id": "s/1",
        "solved": False,
        "moves": 15,
        "optimal_moves": 6,
        "parse_failures": 3,
        "actions": [],
    },
]
SUMMARY = {
    "n": 2,
    "solved": 1,
    "success_rate": 0.5,
    "success_ci95": [0.0945, 0.9055],
    "mean_moves_solved": 5.0,
    "moves_over_optimal": None,
    "parse_failure_rate": 0.15,
    "budget_ceiling": 1.0,
}


def test_eval_report_metrics_table_and_artifacts(uri, mlflow_root, tmp_path):
    # given an eval output directory as the eval stage writes it
    eval_dir = write_eval_dir(tmp_path / "eval" / "baseline", ROWS, SUMMARY)
    runs = lineage.start_pipeline_run(uri)
    run_id = runs.run_id("baseline_eval")
    # when it is logged
    metrics = evals.log_eval_report(uri, run_id, eval_dir)
    # then the headline metrics carry the design's names (avg_moves derived from the rows)
    logged = client_of(uri).get_run(run_id).data.metrics
    assert logged == metrics
    assert logged["eval/success_rate"] == 0.5
    assert logged["eval/avg_moves"] == 10.0
    assert logged["eval/parse_failure_rate"] == 0.15
    assert (logged["eval/success_ci95_low"], logged["eval/success_ci95_high"]) == (0.0945, 0.9055)
    assert logged["eval/budget_ceiling"] == 1.0 and logged["eval/n_mazes"] == 2
    assert "eval/moves_over_optimal" not in logged, "None fields are skipped"
    # and the per-maze table, summary and GIFs are artifacts
    artifacts = mlflow_root / "mlartifacts" / run_id / "artifacts" / "eval"
    table = json.loads((artifacts / "results.json").read_text())
    assert table["columns"][:3] == ["index", "maze_id", "solved"]
    assert [row[1] for row in table["data"]] == ["s/0", "s/1"]
    assert json.loads((artifacts / "summary.json").read_text()) == SUMMARY
    assert (artifacts / "gifs" / "maze-0-solved.gif").read_bytes()[:6] == b"GIF89a"


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"summary.json": json.dumps(SUMMARY)}, "has no results.jsonl"),
        ({"results.jsonl": ""}, "has no summary.json"),
        ({"results.jsonl": "", "summary.json": "{not json"}, "unreadable JSON"),
        ({"results.jsonl": "", "summary.json": json.dumps({"n": 0})}, "lacks success_rate"),
    ],
)
def test_bad_eval_dir_is_refused_before_logging(uri, tmp_path, files, message):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    runs = lineage.start_pipeline_run(uri)
    with pytest.raises(EvalReportError, match=message):
        evals.log_eval_report(uri, runs.run_id("final_eval"), tmp_path)
    assert client_of(uri).get_run(runs.run_id("final_eval")).data.metrics == {}
