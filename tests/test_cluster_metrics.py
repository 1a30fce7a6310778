"""Training gauges: a no-op outside Ray, and real Prometheus series on the local head inside a job."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import urllib.request
import uuid

from mazerl.cluster.jobs.spec import JobSpec, project_root
from mazerl.cluster.jobs.submitter import RayJob
from mazerl.cluster.metrics import GAUGES, PROMETHEUS_NAMES


def test_recording_outside_ray_is_a_no_op():
    code = "from mazerl.cluster.metrics import TrainingMetrics as T; m = T('r'); print(m.active, m.record(1, reward_mean=0.5))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=project_root())
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"], "without ray.init nothing is exported and nothing fails"


def test_gauges_reach_the_nodes_prometheus_endpoint(local_ray_head, tmp_path):
    run = f"metrics-{uuid.uuid4().hex[:8]}"
    release = tmp_path / "release"
    script = tmp_path / "trainer.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import os, time, ray
            from mazerl.cluster.metrics import TrainingMetrics
            ray.init()
            metrics = TrainingMetrics({run!r}, backend="local")
            assert metrics.record(7, reward_mean=0.625, success_rate=0.5, step_seconds=2.25)
            print("recorded", flush=True)
            deadline = time.time() + 90
            while not os.path.exists({str(release)!r}) and time.time() < deadline:
                time.sleep(0.2)
            """
        )
    )
    job = RayJob(
        local_ray_head.address,
        JobSpec(f"python {script}", pipeline_run_id=run, attempt=1),
        headers=local_ray_head.auth_headers(),
        log=lambda _line: None,
    )
    with job:
        expected = {
            PROMETHEUS_NAMES["mazerl_train_reward_mean"]: 0.625,
            PROMETHEUS_NAMES["mazerl_train_success_rate"]: 0.5,
            PROMETHEUS_NAMES["mazerl_train_step_seconds"]: 2.25,
            PROMETHEUS_NAMES["mazerl_train_global_step"]: 7.0,
        }
        found: dict[str, float] = {}
        deadline = time.monotonic() + 60
        while len(found) < len(expected) and time.monotonic() < deadline:
            with urllib.request.urlopen(local_ray_head.metrics_url, timeout=5) as response:
                text = response.read().decode()
            for line in text.splitlines():
                name = line.split("{", 1)[0]
                if name in expected and f'run_id="{run}"' in line:
                    found[name] = float(line.rsplit(" ", 1)[1])
            time.sleep(0.5)
        release.touch()
        job.wait()
    assert found == expected, f"every gauge appears under its Prometheus name with this run's tag: {found}"
    assert set(PROMETHEUS_NAMES) == set(GAUGES)
