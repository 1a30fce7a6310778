"""MLflow lineage on a real SQLite store: parent and stage runs, re-attach, params, eval set and reports."""

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from pydantic import BaseModel

from envs.evalset import EvalSetError, path_for
from envs.render import episode_gif
from mazerl.tracking import lineage
from mazerl.tracking.lineage import STAGES, EvalReportError, LineageError


def client_of(uri):
    return MlflowClient(tracking_uri=uri)


@pytest.fixture
def uri(mlflow_root):
    return lineage.default_tracking_uri(mlflow_root)


def all_runs(uri, experiment_id):
    return client_of(uri).search_runs([experiment_id], max_results=1000)


def test_pipeline_run_has_parent_and_five_stage_runs(uri, mlflow_root):
    # given an empty store / when a pipeline run starts
    runs = lineage.start_pipeline_run(
        uri, tags={"owner": "ci"}, params={"steps": 3}, flow_run_id="flow-1", deployment="local"
    )
    client = client_of(uri)
    # then the parent carries the Prefect ids and the repository's commit
    parent = client.get_run(runs.parent_run_id)
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent)
    assert parent.info.run_name == "pipeline"
    assert parent.data.tags["prefect.flow_run_id"] == "flow-1"
    assert parent.data.tags["prefect.deployment"] == "local"
    assert parent.data.tags["mlflow.source.git.commit"] == head.stdout.strip(), "parent should record HEAD"
    assert parent.data.tags["owner"] == "ci"
    assert parent.data.params == {"steps": "3"}
    # and five children named after the stages, nested under it, waiting to start
    assert list(runs.stage_run_ids) == list(STAGES)
    for stage, run_id in runs.stage_run_ids.items():
        child = client.get_run(run_id)
        assert child.info.run_name == stage
        assert child.data.tags["mlflow.parentRunId"] == runs.parent_run_id
        assert child.info.status == "SCHEDULED", f"{stage} should wait for its stage, got {child.info.status}"
    # and the experiment keeps its artifacts under <root>/mlartifacts
    experiment = client.get_experiment(runs.experiment_id)
    assert experiment.name == "vlm-maze-grpo"
    assert experiment.artifact_location == (mlflow_root / "mlartifacts").as_uri()
    assert runs.job_env("train") == {"MLFLOW_TRACKING_URI": uri, "MLFLOW_RUN_ID": runs.run_id("train")}


def test_retried_flow_run_reattaches_to_its_runs(uri):
    # given a pipeline run whose flow failed half-way
    first = lineage.start_pipeline_run(uri, params={"steps": 3}, flow_run_id="flow-2")
    lineage.set_run_status(uri, first.run_id("verify_cluster"), "FINISHED")
    lineage.set_run_status(uri, first.run_id("train"), "FAILED")
    lineage.set_run_status(uri, first.parent_run_id, "FAILED")
    client_of(uri).delete_run(first.run_id("final_eval"))  # a stage run lost in between
    # when the flow run is retried (same flow-run id, same params)
    again = lineage.start_pipeline_run(uri, params={"steps": 3}, flow_run_id="flow-2")
    # then the same parent and stage runs come back, only the lost one is recreated
    assert again.reattached and not first.reattached
    assert again.parent_run_id == first.parent_run_id
    for stage in STAGES:
        same = again.run_id(stage) == first.run_id(stage)
        assert same == (stage != "final_eval"), f"{stage}: reuse expected unless it was deleted"
    assert client_of(uri).get_run(again.parent_run_id).info.status == "RUNNING"
    assert client_of(uri).get_run(again.run_id("verify_cluster")).info.status == "FINISHED"
    assert len(all_runs(uri, again.experiment_id)) == 1 + len(STAGES)
    # and another flow run gets runs of its own
    other = lineage.start_pipeline_run(uri, flow_run_id="flow-3")
    assert other.parent_run_id != first.parent_run_id and not other.reattached


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
    assert lineage.flatten_params(values) == expected


def test_flatten_params_truncates_to_mlflow_limits():
    flat = lineage.flatten_params({"long": "x" * 10_000, "k" * 300: 1})
    assert len(flat["long"]) == 6000 and flat["long"].endswith("...[truncated]")
    assert max(len(key) for key in flat) == 250


def test_eval_set_is_logged_as_dataset_input_with_digest(uri):
    runs = lineage.start_pipeline_run(uri)
    run_id = runs.run_id("baseline_eval")
    digest = lineage.log_eval_set(uri, run_id, "maze256-small-v1")
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
        lineage.log_eval_set(uri, runs.run_id("baseline_eval"), tampered)
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
    metrics = lineage.log_eval_report(uri, run_id, eval_dir)
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
        lineage.log_eval_report(uri, runs.run_id("final_eval"), tmp_path)
    assert client_of(uri).get_run(runs.run_id("final_eval")).data.metrics == {}


def test_merged_model_is_uploaded_or_pointed_to_by_size(uri, mlflow_root, tmp_path):
    merged = tmp_path / "merged"
    merged.mkdir()
    (merged / "config.json").write_text("{}")
    (merged / "model.safetensors").write_bytes(b"\0" * 300_000)
    (merged / "merge_record.json").write_text(json.dumps({"logits_max_abs_diff": 1e-6, "checkpoint_step": 3}))
    runs = lineage.start_pipeline_run(uri)
    run_id = runs.run_id("merge_lora")
    small = lineage.log_merged_model(uri, run_id, merged, max_artifact_mb=1.0)
    artifacts = mlflow_root / "mlartifacts" / run_id / "artifacts"
    assert small.uploaded and small.source == (artifacts / "merged_model").as_uri()
    assert (artifacts / "merged_model" / "model.safetensors").stat().st_size == 300_000
    assert client_of(uri).get_run(run_id).data.metrics == {"merge/logits_max_abs_diff": 1e-6}
    # above the size limit only a pointer to the shared-storage path is logged
    other = lineage.start_pipeline_run(uri).run_id("merge_lora")
    large = lineage.log_merged_model(uri, other, merged, max_artifact_mb=0.1)
    pointer_dir = mlflow_root / "mlartifacts" / other / "artifacts" / "merged_model_pointer"
    assert not large.uploaded and large.source == pointer_dir.as_uri()
    assert json.loads((pointer_dir / "pointer.json").read_text())["path"] == str(merged.resolve())
    assert not (mlflow_root / "mlartifacts" / other / "artifacts" / "merged_model").exists()
