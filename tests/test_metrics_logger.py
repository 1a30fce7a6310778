"""Metric logging survives an MLflow outage (real MLflow server on loopback, stopped and restarted)."""

import json
import socket
import subprocess
import sys
import time

import mlflow
import pytest
import requests
from mlflow.tracking import MlflowClient

from mazerl.tracking.metrics import MetricsLogger


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(tmp_path, port):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--backend-store-uri",
            f"sqlite:///{tmp_path / 'mlflow.db'}",
            "--default-artifact-root",
            str(tmp_path / "artifacts"),
            "--workers",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 90
    while time.time() < deadline:
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=1).ok:
                return proc
        except requests.RequestException:
            time.sleep(0.5)
    proc.kill()
    pytest.fail("mlflow server did not start within 90 s")


def stop_server(proc):
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_metrics_logged_during_an_outage_are_delivered_later(tmp_path):
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server = start_server(tmp_path, port)
    try:
        run_id = MlflowClient(uri).create_run(MlflowClient(uri).create_experiment("outage")).info.run_id
        warnings = []
        logger = MetricsLogger(uri, run_id, tmp_path / "metrics.jsonl", warn=warnings.append, retry_every_s=0)
        logger.log(1, {"train/reward_mean": 0.1})
        stop_server(server)
        logger.log(2, {"train/reward_mean": 0.2})  # server down: held, warned, no exception
        logger.log(3, {"train/reward_mean": 0.3})
        assert warnings and "held for retry" in warnings[-1]
        server = start_server(tmp_path, port)
        logger.log(4, {"train/reward_mean": 0.4})
        logger.close()
        history = MlflowClient(uri).get_metric_history(run_id, "train/reward_mean")
        assert sorted((m.step, m.value) for m in history) == [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.4)]
        lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
        assert [line["step"] for line in lines] == [1, 2, 3, 4], "every step is in the local record too"
    finally:
        stop_server(server)


def test_undeliverable_metrics_are_reported_at_close_not_raised(tmp_path):
    warnings = []
    logger = MetricsLogger(
        f"http://127.0.0.1:{free_port()}", "0" * 32, tmp_path / "m.jsonl", warn=warnings.append, retry_every_s=0
    )
    logger.log(1, {"train/grad_norm": 1.0})
    logger.close()
    assert "could not be delivered" in warnings[-1] and str(tmp_path / "m.jsonl") in warnings[-1]


def test_sqlite_store_receives_batched_metrics(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("e")).info.run_id
    logger = MetricsLogger(uri, run_id, tmp_path / "m.jsonl")
    for step in range(1, 4):
        logger.log(step, {"train/policy_loss": step * 0.5, "train/step_seconds": 1.0})
    logger.close()
    assert [m.value for m in client.get_metric_history(run_id, "train/policy_loss")] == [0.5, 1.0, 1.5]


def test_a_reopened_record_logs_each_step_once_and_sends_mlflow_what_it_lacks(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("e")).info.run_id
    path = tmp_path / "metrics.jsonl"
    first = MetricsLogger(uri, run_id, path)
    first.log(1, {"train/reward_mean": 0.1})
    first.log(2, {"train/reward_mean": 0.2})
    # Given a job killed after step 3's row reached the file but before MLflow got it, mid-way through step 4's row,
    with open(path, "a") as handle:
        handle.write(json.dumps({"step": 3, "time_ms": 3, "train/reward_mean": 0.3}) + "\n" + '{"step": 4, "tra')
    # when the resumed job opens the record again, redoes step 2 and logs step 4,
    again = MetricsLogger(uri, run_id, path)
    assert again.log(2, {"train/reward_mean": 0.25}) is False, "a redone step keeps its first row"
    assert again.log(4, {"train/reward_mean": 0.4}) is True
    again.close()
    # then the file holds each step once (the torn line dropped), and MLflow each step once, step 3 included.
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3, 4]
    history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "train/reward_mean"))
    assert history == [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.4)]
