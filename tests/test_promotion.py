"""Registry promotion on a real SQLite store: the champion alias moves only when it should."""

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from PIL import Image

from envs.evalset import load as load_eval_set
from envs.maze import optimal_moves, solve
from mazerl import paths
from mazerl.evaluation.evaluate import EvalReport
from mazerl.tracking import artifacts, lineage, registry, store
from mazerl.tracking.registry import CHAMPION, RegistryError, promote


@pytest.fixture
def uri(mlflow_root):
    return paths.mlflow_db_uri(mlflow_root)


def merged_model_source(uri, tmp_path) -> tuple[str, str]:
    """A pipeline run whose merge_lora run logged a (tiny stand-in) model directory as its artifact.

    Promotion only needs a source URI; tests/test_tracking_mlflow_model.py logs real models."""
    run_id = lineage.start_pipeline_run(uri).run_id("merge_lora")
    model = tmp_path / f"merged-{run_id}"
    model.mkdir()
    (model / "config.json").write_text("{}")
    store.client_for(uri).log_artifacts(run_id, str(model), "merged_model")
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


def test_a_version_gets_its_description_and_is_listed_on_its_logged_model(uri, tmp_path):
    # Given a merged model logged as an MLflow 3 logged model of its merge run,
    client = MlflowClient(uri)
    runs = lineage.start_pipeline_run(uri)
    merge_run = runs.run_id("merge_lora")
    model = client.create_logged_model(runs.experiment_id, name="merged_model-x", source_run_id=merge_run)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    client.log_model_artifacts(model.model_id, str(tmp_path / "m"))
    # when it is registered under the pipeline run and described,
    decision = promote(uri, "maze-vlm", model.artifact_location, runs.parent_run_id, 0.2, 0.4, model_id=model.model_id)
    registry.describe_version(
        uri, "maze-vlm", decision.version, "baseline 20.0% -> final 40.0%", model_id=model.model_id
    )
    registry.describe_version(
        uri, "maze-vlm", decision.version, "baseline 20.0% -> final 40.0%", model_id=model.model_id
    )
    # then the version names the pipeline run as its source run and the logged model as its model,
    version = client.get_model_version("maze-vlm", decision.version)
    assert version.run_id == runs.parent_run_id
    assert version.model_id in (None, model.model_id), "MLflow's SQL registry keeps no model_id (its server does)"
    assert version.description == "baseline 20.0% -> final 40.0%"
    # and the logged model lists the version once, however often it was described.
    listed = json.loads(client.get_logged_model(model.model_id).tags["mlflow.modelVersions"])
    assert listed == [{"name": "maze-vlm", "version": decision.version}]
    assert registry.model_version_dir(uri, "maze-vlm", "champion") == model.artifact_location.removeprefix("file://")


def fake_eval(tmp_path, name, solved_indices, count=8) -> EvalReport:
    """An eval directory as the eval stage writes it, played by the solver (solved) or a stop at once (failed)."""
    eval_set = load_eval_set("maze256-small-v1")
    out = tmp_path / name
    out.mkdir()
    rows = []
    for index in range(count):
        layout = eval_set.layouts[index]
        actions = solve(layout) if index in solved_indices else ["('stop', 'stop')"]
        rows.append(
            {
                "index": index,
                "seed": int(eval_set.seeds[index]),
                "solved": index in solved_indices,
                "moves": len(actions),
                "optimal_moves": optimal_moves(layout),
                "actions": actions,
            }
        )
    (out / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    summary = {"settings": {"action_format": "tuple"}, "eval_set": eval_set.name}
    (out / "summary.json").write_text(json.dumps(summary))
    solved = len(solved_indices)
    return EvalReport(
        out, out / "results.jsonl", out / "summary.json", (), eval_set.name, count, solved, solved / count,
        (0.0, 1.0), None, None, 0.0, 1.0, 1.0, 1.0, "m", eval_set.digest,
    )  # fmt: skip


def test_the_per_maze_comparison_pairs_the_evals_and_shows_fixed_mazes_baseline_beside_final(uri, tmp_path):
    from mazerl.reporting.per_maze import FIXED_GIFS, TABLE_FILE, counts, log_per_maze

    # Given a baseline that solved mazes 0-2 and a final eval that solved 1-6 (the solvable ones within budget),
    eval_set = load_eval_set("maze256-small-v1")
    fits = [i for i in range(8) if optimal_moves(eval_set.layouts[i]) + 1 <= eval_set.max_moves]
    assert len(fits) >= 6, "the first mazes of the set fit the budget"
    baseline = fake_eval(tmp_path, "baseline", set(fits[:3]))
    final = fake_eval(tmp_path, "final", set(fits[1:6]))
    run_id = lineage.start_pipeline_run(uri).parent_run_id
    # when the comparison is logged on the parent run,
    pairs, gifs = log_per_maze(uri, run_id, baseline, final, tmp_path / "per_maze")
    # then fixed and broken mazes are counted maze by maze,
    assert counts(pairs) == {"fixed": 3, "broken": 1, "still failing": 8 - 5 - 1, "both solved": 2}
    # the MLflow table lists every maze, the changed ones first,
    (tmp_path / "download").mkdir()
    table = json.loads(
        Path(MlflowClient(uri).download_artifacts(run_id, TABLE_FILE, str(tmp_path / "download"))).read_text()
    )
    changes = [row[table["columns"].index("change")] for row in table["data"]]
    assert changes[:4] == ["fixed"] * 3 + ["broken"] and len(changes) == 8
    # and the GIFs show the fixed mazes and the broken one, both episodes side by side.
    assert [gif.name for gif in gifs] == [f"maze{i}-fixed.gif" for i in fits[3:6]][:FIXED_GIFS] + [
        f"maze{fits[0]}-broken.gif"
    ]
    with Image.open(gifs[0]) as image:
        assert image.width > 2 * 336 and image.n_frames > 2, "two scaled-up episodes, frame by frame"
    logged = {a.path for a in MlflowClient(uri).list_artifacts(run_id, "per_maze/gifs")}
    assert logged == {f"per_maze/gifs/{gif.name}" for gif in gifs}
