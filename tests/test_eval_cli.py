"""``mazerl eval`` end to end in a fresh process (its own local Ray)."""

import json
import os
import subprocess
import sys


def test_eval_command_writes_results_summary_and_gifs(starter_model_dir, tmp_path):
    # given the starter and the CLI with two workers on 6 mazes
    out = tmp_path / "eval"
    command = [sys.executable, "-m", "mazerl.cli", "eval", "--model", str(starter_model_dir)]
    command += ["--max-mazes", "6", "--workers", "2", "--gifs", "2", "--out", str(out)]
    env = os.environ | {"RAY_USAGE_STATS_ENABLED": "0"}
    # when it runs
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    # then it succeeds, prints the headline and writes the files (the starter's own eval set by default)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "success" in done.stdout and "budget ceiling" in done.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["eval_set"] == "maze256-small-v1" and summary["n"] == 6
    assert len((out / "results.jsonl").read_text().splitlines()) == 6
    assert len(list((out / "gifs").glob("*.gif"))) == 2
