"""What a user sees of a pipeline run in the MLflow UI, checked in headless Chromium.

Starts the UI as ``mazerl ui`` does (``mlflow ui`` with one worker and no access log, on a free
loopback port), opens the links the pipeline prints and the docs give, and checks the pages as
rendered: on the parent's run page its description (baseline -> final, the decision, the per-maze
table, the learning curve image with its baseline), its headline metrics and its registered
version; every stage run in the runs table, in pipeline order, with its own duration; an episode
GIF that loads; the registered version's page with its description and the link back to the
pipeline run; and the merged model in the experiment's *Models* tab. With ``screenshots`` set,
PNGs of the pages are written there (the ones in docs/img come from this).

Chromium comes from Debian (``apt-get install chromium-headless-shell``, done by .ci/run) and is
driven by Playwright's Python client (the ``test`` extra); Playwright's own browser download is
not used (CI reaches package registries only).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from mlflow.tracking import MlflowClient

from cli.ui import UI_ENV, ui_command_line
from mazerl.reporting.promotion import ALL_MAZES_SHOWN, CHANGED_ROWS_SHOWN
from mazerl.tracking.lineage import STAGES
from mazerl.tracking.store import HEADLINE_METRICS, experiment_url

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
        command = ui_command_line(root, "127.0.0.1", self.port)  # what `mazerl ui` runs
        self._log = open(log_path, "w")  # noqa: SIM115 (closed in __exit__)
        self._process = subprocess.Popen(
            command,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=os.environ | UI_ENV,
        )

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
    index = _row_index(page, run_name)
    cells = page.locator(f"div[role=row][row-index='{index}'] div[role=gridcell]")
    return {cells.nth(i).get_attribute("col-id"): cells.nth(i).inner_text() for i in range(cells.count())}


def format_duration(ms: int) -> str:
    """MLflow's Utils.formatDuration, as the runs table prints a duration."""
    if ms < 500:
        return f"{ms}ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f}s"
    return f"{ms / 60_000:.1f}min" if ms < 3_600_000 else f"{ms / 3_600_000:.1f}h"


def _wait_for_image(page, selector: str) -> dict:
    """The first image matching ``selector`` once loaded: its natural size."""
    image = page.locator(selector).first
    image.wait_for()
    image.scroll_into_view_if_needed()
    page.wait_for_function("(img) => img.complete && img.naturalWidth > 0", arg=image.element_handle())
    return image.evaluate("img => ({width: img.naturalWidth, height: img.naturalHeight})")


def check_pipeline_run_pages(root: Path, summary, tmp_path: Path, screenshots: str | None = None) -> None:
    from playwright.sync_api import sync_playwright

    client = MlflowClient(summary.tracking_uri)
    parent = client.get_run(summary.mlflow_run_id)
    experiment_id = parent.info.experiment_id
    children = {
        run.info.run_name: run
        for run in client.search_runs([experiment_id], f"tags.`mlflow.parentRunId` = '{summary.mlflow_run_id}'")
    }
    version = client.get_model_version(summary.registered_model, summary.version)
    shots = Path(screenshots) if screenshots else None
    with MlflowUi(root, tmp_path / "mlflow-ui.log") as ui, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.set_default_timeout(PAGE_TIMEOUT_MS)
        # 1. The link the run's summary prints opens the parent's run page: its description tells the
        # story (baseline -> final, the decision, the per-maze table, the learning curve with its
        # baseline), with the headline metrics and the registered version beside it.
        page.goto(summary.mlflow_url.replace("http://127.0.0.1:5000", ui.url))
        headline = f"baseline {summary.baseline:.1%} -> final {summary.final:.1%}"
        page.get_by_text(headline).first.wait_for()
        _close_assistant(page)
        more = page.get_by_text("Show more", exact=True)
        if more.count():  # the run page shows a long description folded
            more.first.click()
        text = page.inner_text("body")
        assert summary.run_id in text, "the run page is titled with the readable run id"
        assert summary.decision in text, "the description says what promotion decided and why"
        curve = _wait_for_image(page, "img[src*='learning_curve.png']")
        assert curve["width"] >= 800, f"the learning curve loads in the description: {curve}"
        table = page.locator("table", has_text="optimal moves").first
        assert table.count(), "the description holds the per-maze table"
        mazes = int(children["final_eval"].data.metrics["eval/n_mazes"])
        expected = mazes if mazes <= ALL_MAZES_SHOWN else min(summary.fixed + summary.broken, CHANGED_ROWS_SHOWN)
        assert table.locator("tbody tr").count() == expected, "the per-maze table's rows"
        page.get_by_text(HEADLINE_METRICS[-1]).first.wait_for()
        text = page.inner_text("body")
        for name in summary.headline_metrics():
            assert name in text, f"the run page lists the headline metric {name}"
        assert f"{summary.registered_model}" in text and f"v{summary.version}" in text, (
            "Registered models lists this run's version"
        )
        page.locator("a", has_text="verify_cluster").first.wait_for()  # "Child runs" lists the stages
        for stage in STAGES:
            assert page.locator("a", has_text=stage).count(), f"the run page links the stage run {stage}"
        if shots:
            page.evaluate("window.scrollTo(0, 0)")
            page.screenshot(path=str(shots / "mlflow_run_page.png"))
            table.scroll_into_view_if_needed()
            page.screenshot(path=str(shots / "mlflow_run_story.png"))
        # 2. The runs table (the docs' link) shows the headline metric columns, and the pipeline run
        # followed by its stage runs top-down in pipeline order, each with its own duration.
        page.goto(experiment_url(ui.url, experiment_id))
        parent_cells = _row_cells(page, summary.run_id)
        for name in HEADLINE_METRICS:
            assert f"metrics.`{name}`" in parent_cells, f"headline metric columns: {sorted(parent_cells)}"
        order = [int(_row_index(page, summary.run_id))]
        for stage in STAGES:
            info = children[stage].info
            cells = _row_cells(page, stage)
            assert cells.get("duration") == format_duration(info.end_time - info.start_time), (stage, cells)
            order.append(int(_row_index(page, stage)))
        assert order == list(range(order[0], order[0] + 6)), (
            f"rows: {dict(zip(['parent', *STAGES], order, strict=True))}"
        )
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
        assert _wait_for_image(page, "img[src^='blob:']")["width"] >= 336, "GIFs are scaled up for the UI"
        if shots:
            page.screenshot(path=str(shots / "mlflow_gif.png"))
        # 4. The registry page of this run's version: its description, and the link to the pipeline run.
        page.goto(
            f"{ui.url}/#/models/{summary.registered_model}/versions/{summary.version}?workflowType=machine_learning"
        )
        page.get_by_text(headline).first.wait_for()
        assert summary.decision.split(": ", 1)[-1] in page.inner_text("body"), "the version says the decision"
        link = page.locator(f"a[href*='/runs/{summary.mlflow_run_id}']", has_text=summary.run_id).first
        link.wait_for()
        assert version.run_id == summary.mlflow_run_id, "the version's source run is the pipeline run"
        if shots:
            page.screenshot(path=str(shots / "mlflow_registry_version.png"))
        link.click()
        page.get_by_text(headline).first.wait_for()  # the link lands on the pipeline run's page
        # 5. The experiment's Models tab lists the merged model as an MLflow 3 logged model.
        model = client.get_logged_model(version.tags["mazerl.logged_model_id"])
        page.goto(f"{ui.url}/#/experiments/{experiment_id}/models?workflowType=machine_learning")
        page.get_by_text(model.name).first.wait_for()
        if shots:
            page.screenshot(path=str(shots / "mlflow_models_tab.png"))
        browser.close()


def _row_index(page, run_name: str) -> str:
    """The runs table's row index of the run named exactly ``run_name``."""
    link = page.locator("div[role=row] a").filter(has_text=re.compile(f"^{re.escape(run_name)}$")).first
    link.wait_for(timeout=PAGE_TIMEOUT_MS)
    return link.locator("xpath=ancestor::div[@role='row'][1]").get_attribute("row-index")


def _close_assistant(page) -> None:
    """MLflow 3.17 opens its Assistant chat panel beside every page; close it (it only takes room)."""
    close = page.locator("button[data-component-id='mlflow.assistant.chat_panel.close']")
    if close.count():
        close.first.click()
