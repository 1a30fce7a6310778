"""Each filter of known noise in a successful run's output, proved to remove that noise and nothing else."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]

PEFT_WRAP = """
import warnings
warnings.simplefilter("default")
{prelude}
from peft import LoraConfig, get_peft_model
from transformers import GPT2Config, GPT2LMHeadModel

model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=1, vocab_size=16, n_positions=8))
get_peft_model(model, LoraConfig(r=1, target_modules=["c_attn"]))
warnings.warn("a real FutureWarning of ours", FutureWarning)
"""


@pytest.mark.parametrize("prelude", ["", "import mazerl"], ids=["without mazerl", "with mazerl"])
def test_peft_wrapping_a_model_does_not_print_the_deprecated_property_warning(prelude):
    # Given peft wrapping a transformers model (what training, the merge and adapter evals do),
    result = subprocess.run(
        [sys.executable, "-c", PEFT_WRAP.format(prelude=prelude)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    # then transformers' deprecation of is_gradient_checkpointing shows only without our filter,
    assert ("is_gradient_checkpointing` is deprecated" in result.stderr) == (prelude == ""), result.stderr
    # and other FutureWarnings still show.
    assert "a real FutureWarning of ours" in result.stderr


@pytest.mark.parametrize(("code", "shown"), [(1000, False), (1006, True)])
def test_only_the_normal_end_of_a_job_log_stream_is_dropped(code, shown, caplog):
    import mazerl.cluster.jobs.log  # noqa: F401 - installs the filter on Ray's job client logger

    caplog.set_level(logging.INFO)
    logging.getLogger("ray.dashboard.modules.job.sdk").info(f"WebSocket closed for job j with close code {code}")
    assert any("WebSocket closed" in r.getMessage() for r in caplog.records) == shown, caplog.records


def test_ansi_colour_codes_are_removed_from_job_lines():
    from mazerl.cluster.jobs.log import plain_text

    assert (
        plain_text("\x1b[36m(pid=42)\x1b[0m step 1/2: reward \x1b[1;32m0.5\x1b[0m") == "(pid=42) step 1/2: reward 0.5"
    )
    assert plain_text("[36m is not an escape without ESC") == "[36m is not an escape without ESC"


def test_a_redrawn_progress_bar_in_job_output_is_logged_once_in_its_last_state():
    from mazerl.cluster.jobs.log import plain_text

    bar = "Writing model shards:   0%|          | 0/1\rWriting model shards: 100%|##########| 1/1"
    assert plain_text(bar) == "Writing model shards: 100%|##########| 1/1"


def pip_warning_filter() -> str:
    """The PYTHONWARNINGS value the Makefile gives pip for the project's editable install."""
    makefile = (PROJECT / "Makefile").read_text()
    match = re.search(r"^PIP_QUIET_WARNINGS \?= (.+)$", makefile, re.MULTILINE)
    assert match, "the Makefile defines PIP_QUIET_WARNINGS"
    install = [line for line in makefile.splitlines() if "pip install" in line and "-e '.[test]'" in line]
    assert install and all('PYTHONWARNINGS="$(PIP_QUIET_WARNINGS)"' in line for line in install), install
    return match.group(1).strip().strip('"')


def test_the_editable_install_banner_of_setuptools_is_silenced_and_other_warnings_are_not():
    # Given setuptools' warning as its editable build emits it (BuildBackendWarning, a UserWarning),
    banner = "Editable installation.\\n!!\\n\\n    Please be careful with folders in your working directory"
    script = f"import warnings\nwarnings.warn({banner!r}, UserWarning)\nwarnings.warn('another warning', UserWarning)"
    # when it runs with the filter the Makefile gives pip,
    env = os.environ | {"PYTHONWARNINGS": pip_warning_filter()}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    # then the banner is gone and another warning still shows.
    assert "Editable installation" not in result.stderr and "another warning" in result.stderr, result.stderr
