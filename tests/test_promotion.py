"""Registry promotion on a real SQLite store: the champion alias moves only when it should."""

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from mazerl.tracking import artifacts, lineage, registry, store
from mazerl.tracking.registry import CHAMPION, RegistryError, promote


@pytest.fixture
def uri(mlflow_root):
    return store.default_tracking_uri(mlflow_root)


def merged_model_source(uri, tmp_path) -> tuple[str, str]:
    """A pipeline run whose merge_lora run logged a (tiny stand-in) model directory as its artifact.

    Promotion only needs a source URI; tests/test_tracking_mlflow_model.py logs real models."""
    run_id = lineage.start_pipeline_run(uri).run_id("merge_lora")
    model = tmp_path / f"merged-{run_id}"
    model.mkdir()
    (model / "config.json").write_text("{}")
    artifacts.log_dir_artifacts(uri, run_id, model, "merged_model")
    return artifacts.artifact_uri(uri, run_id, "merged_model"), run_id


def champion_version(uri, name="maze-vlm"):
    """The version the champion alias points at, None when it points nowhere (any MLflow error is raised)."""
    aliases = MlflowClient(uri).get_registered_model(name).aliases  # {alias: version}
    return str(aliases[CHAMPION]) if CHAMPION in aliases else None


def test_first_run_that_beats_its_baseline_becomes_champion(uri, tmp_path):
    source, run_id = merged_model_source(uri, tmp_path)
    decision = promote(uri, "maze-vlm", source, run_id, baseline_success=0.2, final_success=0.35)
    assert decision.promoted and decision.version == "1"
    assert "beats the baseline 0.200 and no champion" in decision.reason
    assert champion_version(uri) == "1"
    version = MlflowClient(uri).get_model_version("maze-vlm", "1")
    assert version.source == source and version.run_id == run_id
    assert version.tags["mazerl.baseline_success"] == "0.200000"
    assert version.tags["mazerl.final_success"] == "0.350000"
    assert version.tags["mazerl.run_id"] == run_id


@pytest.mark.parametrize("final", [0.2, 0.1])
def test_no_better_than_baseline_is_registered_but_not_promoted(uri, tmp_path, final):
    source, run_id = merged_model_source(uri, tmp_path)
    decision = promote(uri, "maze-vlm", source, run_id, baseline_success=0.2, final_success=final)
    assert not decision.promoted
    assert "does not beat this run's baseline 0.200" in decision.reason
    assert champion_version(uri) is None, "the alias must not move"
    assert (
        MlflowClient(uri)
        .get_model_version("maze-vlm", decision.version)
        .tags["mazerl.promotion"]
        .startswith("not promoted")
    )


def test_better_champion_keeps_the_alias(uri, tmp_path):
    first_source, first_run = merged_model_source(uri, tmp_path)
    assert promote(uri, "maze-vlm", first_source, first_run, 0.2, 0.6).promoted
    # a later run beats its own baseline but not the champion
    source, run_id = merged_model_source(uri, tmp_path)
    decision = promote(uri, "maze-vlm", source, run_id, baseline_success=0.2, final_success=0.5)
    assert not decision.promoted and decision.version == "2"
    assert decision.previous_champion_version == "1" and decision.previous_champion_success == 0.6
    assert "does not beat the champion (version 1, 0.600)" in decision.reason
    assert champion_version(uri) == "1"
    # and one that beats both takes the alias over
    source, run_id = merged_model_source(uri, tmp_path)
    decision = promote(uri, "maze-vlm", source, run_id, baseline_success=0.2, final_success=0.7)
    assert decision.promoted and champion_version(uri) == "3"


def test_threshold_blocks_a_weak_winner(uri, tmp_path):
    source, run_id = merged_model_source(uri, tmp_path)
    decision = promote(uri, "maze-vlm", source, run_id, 0.1, 0.3, threshold=0.5)
    assert not decision.promoted and "below the promotion threshold 0.500" in decision.reason
    assert champion_version(uri) is None


def test_repeated_promotion_reuses_its_version(uri, tmp_path):
    source, run_id = merged_model_source(uri, tmp_path)
    first = promote(uri, "maze-vlm", source, run_id, 0.1, 0.3)
    again = promote(uri, "maze-vlm", source, run_id, 0.1, 0.3)
    assert again.version == first.version == "1" and again.promoted
    assert len(MlflowClient(uri).search_model_versions("name = 'maze-vlm'")) == 1


@pytest.mark.parametrize("name", ["maze/vlm", "maze:vlm", "", " maze", "maze-vlm\n", "modèle"])
def test_illegal_registered_model_names(uri, name):
    with pytest.raises(RegistryError, match="is not a legal model name"):
        promote(uri, name, "file:///nowhere", "0" * 32, 0.1, 0.2)


@pytest.mark.parametrize(
    ("baseline", "final", "threshold", "field"),
    [(1.5, 0.2, 0.0, "baseline_success"), (0.1, float("nan"), 0.0, "final_success"), (0.1, 0.2, -1, "threshold")],
)
def test_rates_must_be_between_zero_and_one(uri, baseline, final, threshold, field):
    with pytest.raises(RegistryError, match=field):
        promote(uri, "maze-vlm", "file:///nowhere", "0" * 32, baseline, final, threshold)


def test_registered_version_resolves_to_a_model_directory(uri, tmp_path):
    source, run_id = merged_model_source(uri, tmp_path)
    promote(uri, "maze-vlm", source, run_id, 0.1, 0.3)
    resolved = Path(registry.model_version_dir(uri, "maze-vlm", "champion"))
    assert (resolved / "config.json").is_file() and resolved.as_uri() == source
    with pytest.raises(RegistryError, match="no version or alias 'missing'"):
        registry.model_version_dir(uri, "maze-vlm", "missing")


@pytest.mark.parametrize(("fixed", "broken"), [(0, 0), (1, 0), (5, 1), (3, 3), (0, 12), (30, 4)])
def test_exact_mcnemar_p_is_scipys_exact_binomial_test_on_the_discordant_mazes(fixed, broken):
    from scipy.stats import binomtest

    from mazerl.evaluation.summary import exact_mcnemar_p

    expected = 1.0 if fixed + broken == 0 else binomtest(fixed, fixed + broken, 0.5).pvalue
    assert exact_mcnemar_p(fixed, broken) == pytest.approx(expected, rel=1e-12)


def test_two_flow_runs_promoting_one_trained_adapter_register_one_version(uri, tmp_path):
    from mazerl.tracking.registry import TrainedAdapter

    # Given two flow runs that followed one training (the second re-attached to the first's job), each
    # merging the same adapter into its own run directory and logging it from its own merge_lora run,
    adapter = TrainedAdapter(training_run="festive-rattlesnake-1a2b3c4d", adapter_sha256="ab" * 32)
    first_source, first_run = merged_model_source(uri, tmp_path)
    second_source, second_run = merged_model_source(uri, tmp_path)
    # when both reach promote (and the first one's promotion is retried),
    first = promote(uri, "maze-vlm", first_source, first_run, 0.2, 0.35, adapter=adapter)
    again = promote(uri, "maze-vlm", first_source, first_run, 0.2, 0.35, adapter=adapter)
    second = promote(uri, "maze-vlm", second_source, second_run, 0.2, 0.35, adapter=adapter)
    # then the adapter is registered once, described by the run that got there first,
    versions = MlflowClient(uri).search_model_versions("name = 'maze-vlm'")
    assert [str(v.version) for v in versions] == ["1"], [(v.version, v.run_id) for v in versions]
    assert first.version == again.version == second.version == "1"
    assert versions[0].run_id == first_run and versions[0].tags["mazerl.adapter_sha256"] == "ab" * 32
    assert versions[0].tags["mazerl.trained_run"] == adapter.training_run
    # and another adapter of the same training run (a longer training) is a version of its own.
    other = TrainedAdapter(training_run=adapter.training_run, adapter_sha256="cd" * 32)
    assert promote(uri, "maze-vlm", second_source, second_run, 0.2, 0.4, adapter=other).version == "2"


def test_promotions_of_one_adapter_that_raced_end_on_the_first_version(uri, tmp_path):
    from mazerl.tracking.registry import TrainedAdapter, keep_first_version

    # Given two promotions of one adapter that both found no version and both registered one,
    adapter = TrainedAdapter(training_run="r", adapter_sha256="ef" * 32)
    client = MlflowClient(uri)
    registry.promote(uri, "maze-vlm", *merged_model_source(uri, tmp_path), 0.2, 0.3, adapter=adapter)
    source, run_id = merged_model_source(uri, tmp_path)
    late = client.create_model_version("maze-vlm", source=source, run_id=run_id, tags=adapter.tags())
    # when the later one checks after registering,
    kept = keep_first_version(client, "maze-vlm", adapter, late)
    # then it deletes its own and both end on the first version.
    assert str(kept.version) == "1"
    assert [str(v.version) for v in client.search_model_versions("name = 'maze-vlm'")] == ["1"]
