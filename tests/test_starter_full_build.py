"""The full starter build (the embedded default's SFT stand-in) lands its baseline in the target band.

The slowest test of the policy suites (about 5 minutes on 2 cores: a 4-minute build and a
256-maze eval); docs/performance.md (section starter_build) has the same measurement for
three seeds with the learning curve.
"""

import json

import pytest

from envs.evalset import load as load_eval_set
from mazerl.evaluation.evaluate import evaluate
from mazerl.evaluation.settings import EvalSettings
from mazerl.starter.build import build_starter
from mazerl.starter.config import StarterConfig
from mazerl.starter.record import read_record

pytestmark = pytest.mark.slow  # about 5 minutes: the full starter build


def test_full_build_greedy_baseline_on_the_embedded_set_is_between_15_and_60_percent(tmp_path):
    # given the full recipe with the default seed, built from nothing
    model = build_starter(tmp_path / "maze-starter-v6", StarterConfig(), log=print)
    record = read_record(model)
    # when it plays the 256 held-out mazes of maze256-small-v1 greedily (free decoding)
    report = evaluate(model, EvalSettings("maze256-small-v1", eval_workers=2, gif_count=0), tmp_path / "eval")
    # then it solves a clear minority, as the reference's SFT checkpoint did (43.75%), and speaks the format
    # (the shipped build, maze-starter-v6, solved 44.5% here; builds on other CPUs round differently, hence the band)
    assert 0.15 <= report.success_rate <= 0.60, f"baseline {report.success_rate:.1%} outside [15%, 60%]"
    assert report.parse_failure_rate < 0.05, f"parse failures {report.parse_failure_rate:.1%}"
    assert report.budget_ceiling == load_eval_set("maze256-small-v1").budget_ceiling()  # 253/256
    assert record["warm_start"]["mazes"] == 512, "the warm-start uses only mazes outside the eval set"
    print(json.dumps({"success": report.success_rate, "build_seconds": record["build_seconds"]}))
