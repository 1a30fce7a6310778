"""What a user sees of a pipeline run in the MLflow UI, checked in headless Chromium.

Starts ``mlflow ui`` on the run's store (one worker, a free loopback port), opens the links
the pipeline prints and the docs give, and checks the pages as rendered: the parent's headline
metrics on its run page, every stage run in the runs table with its own duration, and an
episode GIF that loads. With ``screenshots`` set, PNGs of the pages are written there (the ones
in docs/img come from this).

Chromium comes from Debian (``apt-get install chromium-headless-shell``, done by .ci/run) and is
driven by Playwright's Python client (the ``test`` extra); Playwright's own browser download is
not used (CI reaches package registries only).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from mlflow.tracking import MlflowClient

from mazerl.tracking.lineage import STAGES
from mazerl.tracking.store import experiment_url

CHROMIUM_NAMES = ("chromium-headless-shell", "chromium", "chromium-browser")
PAGE_TIMEOUT_MS = 180_000  # the UI's first load on a busy 2-core machine takes tens of seconds


def chromium() -> str:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    raise AssertionError(
        "no Chromium found (looked for " + ", ".join(CHROMIUM_NAMES) + "); install it with "
        "`apt-get install -y --no-install-recommends chromium-headless-shell` (.ci/run does)"
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class MlflowUi:
    """``mlflow ui`` on a local store, stopped (its whole process group) on exit."""

    def __init__(self, root: Path, log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", f"sqlite:///{root}/mlflow.db"]
        command += ["--default-artifact-root", str(root / "mlartifacts"), "--host", "127.0.0.1"]
        command += ["--port", str(self.port), "--workers", "1"]
        self._log = open(log_path, "w")  # noqa: SIM115 (closed in __exit__)
        self._process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)

    def __enter__(self) -> MlflowUi:
        deadline = time.time() + 180
        while time.time() < deadline:
            assert self._process.poll() is None, f"mlflow ui exited early; see {self._log.name}"
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as response:
                    if response.status == 200:
                        return self
            except OSError:
                time.sleep(1)
        raise AssertionError(f"mlflow ui did not answer on {self.url} within 180 s; see {self._log.name}")

    def __exit__(self, *_: object) -> None:
        os.killpg(self._process.pid, 15)
        self._process.wait(timeout=60)
        self._log.close()


def _row_cells(page, run_name: str) -> dict[str, str]:
    """The runs table's cells (by column id) of the row showing ``run_name`` (ag-grid splits a row
    into a pinned and a scrolling part that share a row index)."""
    link = page.locator("div[role=row] a", has_text=run_name).first
    link.wait_for(timeout=PAGE_TIMEOUT_MS)
    index = link.locator("xpath=ancestor::div[@role='row'][1]").get_attribute("row-index")
    cells = page.locator(f"div[role=row][row-index='{index}'] div[role=gridcell]")
    return {cells.nth(i).get_attribute("col-id"): cells.nth(i).inner_text() for i in range(cells.count())}


def format_duration(ms: int) -> str:
    """MLflow's Utils.formatDuration, as the runs table prints a duration."""
    if ms < 500:
        return f"{ms}ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f}s"
    return f"{ms / 60_000:.1f}min" if ms < 3_600_000 else f"{ms / 3_600_000:.1f}h"


def check_pipeline_run_pages(root: Path, summary, tmp_path: Path, screenshots: str | None = None) -> None:
    from playwright.sync_api import sync_playwright

    client = MlflowClient(summary.tracking_uri)
    parent = client.get_run(summary.mlflow_run_id)
    experiment_id = parent.info.experiment_id
    children = {
        run.info.run_name: run
        for run in client.search_runs([experiment_id], f"tags.`mlflow.parentRunId` = '{summary.mlflow_run_id}'")
    }
    shots = Path(screenshots) if screenshots else None
    with MlflowUi(root, tmp_path / "mlflow-ui.log") as ui, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 2000 if shots else 1600, "height": 1000})  # shots: room for columns
        page.set_default_timeout(PAGE_TIMEOUT_MS)
        # 1. The link the run's summary prints opens the parent's run page with its headline metrics.
        page.goto(summary.mlflow_url.replace("http://127.0.0.1:5000", ui.url))
        page.get_by_text("result/final_success").first.wait_for()
        text = page.inner_text("body")
        assert summary.run_id in text, "the run page is titled with the readable run id"
        for name in summary.headline_metrics():
            assert name in text, f"the run page lists the headline metric {name}"
        page.locator("a", has_text="verify_cluster").first.wait_for()  # "Child runs" lists the stages
        for stage in STAGES:
            assert page.locator("a", has_text=stage).count(), f"the run page links the stage run {stage}"
        if shots:
            page.get_by_text("result/budget_ceiling").first.scroll_into_view_if_needed()
            page.screenshot(path=str(shots / "mlflow_run_page.png"))
        # 2. The runs table (the docs' link) shows the headline metric columns, and the stage runs
        # under the parent each with its own duration.
        page.goto(experiment_url(ui.url, experiment_id))
        parent_cells = _row_cells(page, summary.run_id)
        assert "metrics.`result/final_success`" in parent_cells, f"headline metric columns: {sorted(parent_cells)}"
        expander = page.locator("div[role=row] button[data-component-id*='runnamecellrenderer']").first
        expander.click()
        for stage in STAGES:
            info = children[stage].info
            cells = _row_cells(page, stage)
            assert cells.get("duration") == format_duration(info.end_time - info.start_time), (stage, cells)
        assert _row_cells(page, summary.run_id)["duration"] == format_duration(
            parent.info.end_time - parent.info.start_time
        )
        if shots:
            page.screenshot(path=str(shots / "mlflow_runs_table.png"))
        # 3. An episode GIF of the baseline eval loads in the run's artifact view.
        baseline = children["baseline_eval"].info.run_id
        gif = next(a.path for a in client.list_artifacts(baseline, "eval/gifs") if a.path.endswith(".gif"))
        page.goto(
            f"{ui.url}/#/experiments/{experiment_id}/runs/{baseline}/artifacts/{gif}?workflowType=machine_learning"
        )
        image = page.locator("img[src^='blob:']").first  # the artifact view shows the fetched file as a blob
        image.wait_for()
        page.wait_for_function("(img) => img.complete && img.naturalWidth > 0", arg=image.element_handle())
        assert image.evaluate("img => img.naturalWidth") >= 336, "GIFs are scaled up for the UI"
        if shots:
            page.screenshot(path=str(shots / "mlflow_gif.png"))
        browser.close()
