"""The starter build: reproducible, cached under the data root, built once under a lock."""

import json
import threading

import pytest

from mazerl.starter.build import STARTER_NAME, build_starter, ensure_starter, weights_digest
from mazerl.starter.config import StarterConfig
from mazerl.starter.record import RECORD_FILE, StarterError, read_record


def test_two_concurrent_ensure_calls_build_once_and_match_the_fixture_digest(starter_model_dir, tmp_path):
    # given a fresh data root and two callers at once (as two pipeline runs would be)
    config = StarterConfig.reduced_build()
    messages: list[str] = []
    results: list = []

    def call() -> None:
        results.append(ensure_starter(tmp_path, config, log=messages.append))

    threads = [threading.Thread(target=call) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # then exactly one build ran, both got the same directory under models/
    assert results == [tmp_path.resolve() / "models" / STARTER_NAME] * 2
    assert sum("building" in m for m in messages) == 1, messages
    # and the same seed reproduced the session fixture's weights bit for bit (a second, independent build)
    assert read_record(results[0])["weights_sha256"] == read_record(starter_model_dir)["weights_sha256"]
    assert not [p for p in (tmp_path / "models").iterdir() if ".tmp" in p.name], "no temporary build left behind"


def test_record_holds_config_digest_and_learning_curve(starter_model_dir):
    record = json.loads((starter_model_dir / RECORD_FILE).read_text())
    assert record["config"] == StarterConfig.reduced_build().model_dump(mode="json")
    assert len(record["weights_sha256"]) == 64
    curve = record["warm_start"]["curve"]
    assert curve and curve[-1]["step"] == record["warm_start"]["steps"]
    assert curve[-1]["answer_loss"] < curve[0]["answer_loss"], "the warm-start should lower the answer loss"


def test_recorded_digest_is_the_digest_of_the_saved_weights(starter_model_dir):
    from mazerl.policy.loader import load_policy

    model = load_policy(starter_model_dir, device="cpu").model
    assert weights_digest(model) == read_record(starter_model_dir)["weights_sha256"]


def test_a_cached_starter_with_another_config_is_refused(starter_model_dir):
    root = starter_model_dir.parents[1]
    with pytest.raises(StarterError, match="different config"):
        ensure_starter(root, StarterConfig.reduced_build(seed=1), log=lambda _: None)


def test_building_over_an_existing_directory_is_refused(starter_model_dir):
    with pytest.raises(StarterError, match="already exists"):
        build_starter(starter_model_dir, StarterConfig.reduced_build())


def test_a_directory_without_its_record_is_not_taken_as_a_starter(tmp_path):
    (tmp_path / "models" / STARTER_NAME).mkdir(parents=True)
    with pytest.raises(StarterError, match="not a complete starter build"):
        ensure_starter(tmp_path, StarterConfig.reduced_build(), log=lambda _: None)
