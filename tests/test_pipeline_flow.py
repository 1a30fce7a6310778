"""The Prefect pipeline end to end on a miniature config: real Prefect, MLflow (SQLite) and local Ray.

One flow run takes a minute or two on 2 cores: the reduced starter, 4 eval mazes, 2 GRPO steps of
1 maze x 2 samples with 3-move episodes.
"""

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from mazerl.params import PipelineParams
from mazerl.run_clock import STAGES as STAGE_ORDER
from mazerl.tracking.lineage import STAGES
from mazerl.training import checkpoints
from mazerl.training.config import load_config
from mazerl.training.recipes import MINIATURE_TRAINING

pytestmark = pytest.mark.slow  # a minute or two per flow run


@pytest.fixture
def ray_token(local_ray_head, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(local_ray_head.token_path))


def mini_params(root, model_dir, address, **overrides):
    values = {
        "base_model": str(model_dir),
        "eval_set": "maze256-small-v1",
        "data_root": str(root),
        "ray_address": address,
        "max_eval_mazes": 4,
        "eval_workers": 1,
        "gif_count": 2,
        "training": MINIATURE_TRAINING,
    }
    return PipelineParams.model_validate(values | overrides)


def stage_runs(tracking_uri, parent_run_id):
    client = MlflowClient(tracking_uri)
    parent = client.get_run(parent_run_id)
    children = client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'"
    )
    return {run.info.run_name: run for run in children}


@pytest.fixture(scope="module")
def full_run(prefect_api, local_ray_head, starter_model_dir, _mlflow_template_db, tmp_path_factory):
    """One miniature pipeline run for the module: (data root, summary). The browser test reads its store."""
    from prefect.logging.handlers import APILogWorker

    from flows.pipeline import pipeline

    root = tmp_path_factory.mktemp("full-run") / "mazerl-home"
    root.mkdir()
    shutil.copy(_mlflow_template_db, root / "mlflow.db")
    # a periodic greedy eval at step 2 on the 4 mazes the evals play: the learning curve has a point past
    # the baseline's step-0 point
    training = MINIATURE_TRAINING | {"eval_interval": 2, "eval_mazes": 4}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_AUTH_TOKEN_PATH", str(local_ray_head.token_path))
        summary = pipeline(mini_params(root, starter_model_dir, local_ray_head.address, training=training))
    # Prefect sends log records in background batches (every 2 s) and a flow run's end does not wait
    # for them: without the drain, a test reading the logs at once can miss the last stage's lines.
    APILogWorker.drain_all(timeout=60)
    return root, summary


def test_full_flow_leaves_runs_metrics_artifacts_registry_and_prefect_artifacts(
    full_run, starter_model_dir, local_ray_head
):
    from prefect.client.orchestration import get_client

    mlflow_root, summary = full_run
    uri = summary.tracking_uri
    client = MlflowClient(uri)
    parent = client.get_run(summary.mlflow_run_id)
    assert parent.info.status == "FINISHED"
    assert parent.info.run_name == summary.run_id, "the parent is named by the readable run id"
    runs = stage_runs(uri, summary.mlflow_run_id)
    assert set(runs) == set(STAGES)
    assert all(run.info.status == "FINISHED" for run in runs.values()), {n: r.info.status for n, r in runs.items()}
    # each stage run spans its own stage, in pipeline order, inside the parent's span
    spans = [(runs[stage].info.start_time, runs[stage].info.end_time) for stage in STAGES]
    assert parent.info.start_time <= spans[0][0] and spans[-1][1] <= parent.info.end_time
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        assert end <= start, f"stage spans overlap: {spans}"
    # the parent shows the headline numbers and what the run really used
    assert parent.data.metrics == pytest.approx(summary.headline_metrics())
    params = parent.data.params
    assert params["base_model"] == str(starter_model_dir) and len(params["base_model.fingerprint"]) == 64
    assert params["eval_set"] == "maze256-small-v1" and len(params["eval_set.sha256"]) == 64
    assert params["training.recipe"] == "defaults" and params["training.steps"] == "2"
    assert params["training.lora.rank"] == "4" and params["training.learning_rate"] != "None"
    assert "training" not in params and "None" not in (params["base_model"], params["eval_set"])
    assert summary.mlflow_url.endswith(f"/runs/{summary.mlflow_run_id}?workflowType=machine_learning")
    assert summary.mlflow_url in summary.text()
    train_metrics = set(runs["train"].data.metrics)
    for name in ("reward_mean", "success_rate", "response_tokens", "policy_loss", "grad_norm", "step_seconds"):
        assert f"train/{name}" in train_metrics, f"train/{name} missing from {sorted(train_metrics)}"
    assert len(client.get_metric_history(runs["train"].info.run_id, "train/reward_mean")) == 2
    for stage in ("baseline_eval", "final_eval"):
        assert {"eval/success_rate", "eval/avg_moves", "eval/parse_failure_rate"} <= set(runs[stage].data.metrics)
        files = {a.path for a in client.list_artifacts(runs[stage].info.run_id, "eval")}
        assert {"eval/results.json", "eval/summary.json"} <= files
    assert any(a.path == "config" for a in client.list_artifacts(runs["train"].info.run_id))
    assert any(a.path == "learning_curve" for a in client.list_artifacts(summary.mlflow_run_id))
    # the parent's description tells the story, and the per-maze table is beside it
    note = parent.data.tags["mlflow.note.content"]
    assert f"baseline {summary.baseline:.1%} -> final {summary.final:.1%}" in note and summary.decision in note
    assert "learning_curve/learning_curve.png" in note and "The model is the last checkpoint's (step 2)" in note
    assert {a.path for a in client.list_artifacts(summary.mlflow_run_id, "per_maze")} >= {"per_maze/comparison.json"}
    # the baseline is the train run's step-0 greedy eval point, on the mazes the periodic evals play
    greedy = {m.step: m.value for m in client.get_metric_history(runs["train"].info.run_id, "eval/success_rate")}
    assert set(greedy) == {0, 2} and greedy[0] == summary.baseline, greedy
    assert (summary.peak_step, summary.peak_success) == (2, greedy[2])
    # the eval runs say what they evaluated as params; settings are no metrics
    final_run = runs["final_eval"].data
    assert final_run.params["eval.model_dir"] == str(mlflow_root / "runs" / summary.run_id / "merged")
    assert len(final_run.params["eval.model_digest"]) == 64 and final_run.params["eval.set"] == "maze256-small-v1"
    assert final_run.params["eval.engine"] == "hf" and final_run.params["eval.workers"] == "1"
    assert not {"eval/workers", "eval/max_moves"} & set(final_run.metrics)
    # the merge ran as a Ray job that asked Ray for the memory of a whole model copy, not in this process
    from ray.job_submission import JobSubmissionClient

    jobs = JobSubmissionClient(local_ray_head.address, headers=local_ray_head.auth_headers()).list_jobs()
    flow_run_id = client.get_run(summary.mlflow_run_id).data.tags["prefect.flow_run_id"]
    merges = [
        j
        for j in jobs
        if (j.metadata or {}).get("mazerl_pipeline_run") == flow_run_id
        and (j.metadata or {}).get("mazerl_stage") == "merge_lora"
    ]
    assert [str(j.status) for j in merges] == ["SUCCEEDED"], merges
    assert int(merges[0].metadata["mazerl_entrypoint_memory"]) >= 2 * 1024**3, "a whole model copy's memory"
    # the registered version belongs to the pipeline run, comes from the merged model's MLflow 3 logged
    # model, and that model holds the final eval's metrics
    [version] = client.search_model_versions("name = 'maze-vlm'")
    assert version.run_id == summary.mlflow_run_id and version.tags["mazerl.run_id"] == summary.run_id
    assert version.tags["mazerl.merge_run_id"] == runs["merge_lora"].info.run_id
    assert f"[{summary.run_id}](#/experiments/" in version.description and summary.decision in version.description
    model = client.get_logged_model(version.tags["mazerl.logged_model_id"])
    assert model.source_run_id == runs["merge_lora"].info.run_id and model.status == "READY"
    assert version.source == model.artifact_location
    assert {m.key: m.value for m in model.metrics}["eval/success_rate"] == summary.final
    assert (Path(model.artifact_location.removeprefix("file://")) / "MLmodel").is_file()
    assert checkpoints.read_marker(mlflow_root / "runs" / summary.run_id / "checkpoints") == 2
    # the training config prepare resolved once is the one the job trained with (and the one logged)
    resolved = load_config(mlflow_root / "runs" / summary.run_id / "train_config.json")
    assert (resolved.run_id, resolved.steps, resolved.lora.rank) == (summary.run_id, 2, 4)
    assert params["training.learning_rate"] == str(resolved.learning_rate)
    local_summary = json.loads((mlflow_root / "runs" / summary.run_id / "summary.json").read_text())
    assert local_summary["mlflow_run_id"] == summary.mlflow_run_id and local_summary["final"] == summary.final

    async def artifact_keys():
        async with get_client() as prefect:
            return {a.key for a in await prefect.read_artifacts()}

    import asyncio

    keys = asyncio.run(artifact_keys())
    assert {
        "pipeline-summary",
        "baseline-eval-results",
        "final-eval-results",
        "train-progress",
        "verify-cluster",
    } <= keys


def test_the_runs_prefect_log_is_free_of_known_noise(full_run):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    from mazerl.merge.output import MergeReport

    # Given the log of a successful flow run, as Prefect's UI and `prefect flow-run logs` show it,
    root, summary = full_run
    flow_run_id = MlflowClient(summary.tracking_uri).get_run(summary.mlflow_run_id).data.tags["prefect.flow_run_id"]
    messages: list[str] = []
    with get_client(sync_client=True) as client:
        while page := client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])), limit=200, offset=len(messages)
        ):
            messages += [log.message for log in page]
    assert len(messages) > 20, messages
    # then it has no empty records, no raw terminal colour codes, no peft/transformers deprecation noise,
    assert all(message.strip() for message in messages), "an empty log record"
    assert not [m for m in messages if "\x1b[" in m], "raw ANSI escape codes in the log"
    assert not [m for m in messages if "is_gradient_checkpointing" in m]
    assert not [m for m in messages if "%|" in m], "Hugging Face progress bars in the job logs"
    # and the merge's summary once, and every training step line with the time left.
    merge_summary = MergeReport.read(root / "runs" / summary.run_id / "merged").summary()
    assert sum(merge_summary in m for m in messages) == 1, [m for m in messages if "merge" in m]
    steps = [m for m in messages if m.startswith("step ") and "/2:" in m]
    assert len(steps) == 2 and all(" left; " in m and "in total" in m for m in steps), steps
    assert "greedy eval" in steps[1] and "(baseline " in steps[1], "the periodic eval beside the baseline"
    # and one stage line per stage, in order, each with the run's time so far and left.
    stages = [m for m in messages if m.startswith("stage ") and "/7 " in m]
    assert [m.split(":")[0] for m in stages] == [f"stage {k}/7 {name}" for k, name in enumerate(STAGE_ORDER, 1)]
    assert all(" elapsed, " in m for m in stages), stages


def test_a_fresh_run_reports_no_crash_and_no_task_run_ever_crashed(full_run):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterFlowRunId

    # Given a fresh flow run that completed (its baseline stage runs a cached task inside it),
    root, summary = full_run
    flow_run_id = MlflowClient(summary.tracking_uri).get_run(summary.mlflow_run_id).data.tags["prefect.flow_run_id"]
    with get_client(sync_client=True) as client:
        task_runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
        histories = {run.name: [s.type.value for s in client.read_task_run_states(run.id)] for run in task_runs}
        messages: list[str] = []
        log_filter = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
        while page := client.read_logs(log_filter=log_filter, limit=200, offset=len(messages)):
            messages += [log.message for log in page]
    # then none of its task runs was ever marked Crashed (the enclosing baseline_eval included),
    assert {name.rsplit("-", 1)[0] for name in histories} >= {"baseline_eval", "evaluate_baseline", "train"}
    assert not {name: h for name, h in histories.items() if "CRASHED" in h}, histories
    # and its log tells of no crash or killed attempt.
    assert not [m for m in messages if "Crashed" in m or "killed attempt" in m], "a false alarm in a fresh run"


def test_mlflow_ui_in_a_browser_shows_headline_metrics_stage_durations_and_gifs(full_run, tmp_path):
    """Headless Chromium against ``mlflow ui`` on the run's store (tests/mlflow_browser.py)."""
    from mlflow_browser import check_pipeline_run_pages

    mlflow_root, summary = full_run
    check_pipeline_run_pages(mlflow_root, summary, tmp_path, os.environ.get("MAZERL_SCREENSHOTS"))


def flow_run_record(flow_run_id):
    """(task-run state names by task name, log messages by task name) of one flow run, from the Prefect API."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterTaskRunId

    async def read():
        async with get_client() as client:
            runs = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            states, messages = {}, {}
            for run in sorted(runs, key=lambda r: r.expected_start_time):
                name = run.name.rsplit("-", 1)[0]
                states.setdefault(name, run.state.name)
                logs = await client.read_logs(log_filter=LogFilter(task_run_id=LogFilterTaskRunId(any_=[run.id])))
                messages.setdefault(name, []).extend(log.message for log in logs)
            return states, messages

    return asyncio.run(read())


def test_second_run_on_the_same_model_reuses_the_baseline_unless_its_files_are_gone(
    prefect_api, ray_token, mlflow_root, starter_model_dir, local_ray_address
):
    from flows.pipeline import pipeline

    params = mini_params(mlflow_root, starter_model_dir, local_ray_address)
    first = pipeline(params)
    state = pipeline(params, return_state=True)
    second = state.result()
    assert second.run_id != first.run_id
    states, messages = flow_run_record(state.state_details.flow_run_id)
    assert states["evaluate_baseline"] == "Cached", states
    assert any("reusing the cached evaluation" in m for m in messages["baseline_eval"]), "the log says so"
    baseline_dir = mlflow_root / "runs" / second.run_id / "eval" / "baseline"
    assert not baseline_dir.exists(), "the baseline was not evaluated again"
    assert second.baseline == first.baseline
    runs = stage_runs(second.tracking_uri, second.mlflow_run_id)
    assert "eval/success_rate" in runs["baseline_eval"].data.metrics, "the reused report is logged in the new run"
    assert runs["baseline_eval"].data.tags["mazerl.reused_eval_dir"].endswith(f"{first.run_id}/eval/baseline")
    # and when the cached report's run directory is deleted, the next run evaluates again instead of failing.
    shutil.rmtree(mlflow_root / "runs" / first.run_id)
    third = pipeline(params)
    assert (mlflow_root / "runs" / third.run_id / "eval" / "baseline" / "summary.json").is_file()
    assert third.baseline == first.baseline


def test_training_job_killed_mid_run_is_retried_and_resumes(
    prefect_api, ray_token, mlflow_root, starter_model_dir, local_ray_address
):
    from flows.pipeline import pipeline

    training = MINIATURE_TRAINING | {"steps": 4}
    params = mini_params(mlflow_root, starter_model_dir, local_ray_address, training=training, train_retries=2)
    killed = {}

    def kill_after_first_checkpoint():
        deadline = time.time() + 900
        while time.time() < deadline and not killed:
            for marker in mlflow_root.glob("runs/*/checkpoints/" + checkpoints.MARKER):
                step = checkpoints.read_marker(marker.parent)
                for proc in psutil.process_iter(["pid", "cmdline"]):
                    cmdline = " ".join(proc.info["cmdline"] or [])
                    if "mazerl.training.local_entry" in cmdline and str(marker.parents[1]) in cmdline:
                        os.kill(proc.info["pid"], signal.SIGKILL)
                        killed["step"] = step
                        return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_after_first_checkpoint, daemon=True)
    killer.start()
    summary = pipeline(params)
    killer.join(timeout=5)
    assert killed, "the training job was never killed"
    run_dir = mlflow_root / "runs" / summary.run_id
    assert checkpoints.read_marker(run_dir / "checkpoints") == 4
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [line["step"] for line in lines]
    assert sorted(set(steps)) == [1, 2, 3, 4]
    assert steps.count(killed["step"]) == 1 and steps.count(4) == 1, f"a completed step was trained twice: {steps}"


def test_invalid_parameters_fail_before_any_stage(prefect_api, tmp_path):
    from flows.pipeline import pipeline

    root = tmp_path / "root"
    state = pipeline(params={"data_root": str(root), "training": {"learning_rate": -1}}, return_state=True)
    assert state.is_failed()
    with pytest.raises(Exception, match="learning_rate"):
        state.result()
    assert not root.exists(), "nothing is written for a rejected run"
