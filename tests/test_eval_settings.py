"""The eval-engine parameters (eval_engine, eval_gpus_per_worker) from the flows' parameters to the eval job."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from mazerl.evaluation.settings import EvalSettings, eval_request, read_eval_request
from mazerl.params import EvalParams, PipelineParams
from tasks.evaluation import baseline_cache_key, eval_settings


@pytest.mark.parametrize(
    ("given", "engine", "gpus"),
    [
        ({}, "hf", 0.0),
        ({"eval_engine": "vllm"}, "vllm", 1.0),
        ({"eval_engine": "vllm", "eval_gpus_per_worker": 0.5}, "vllm", 0.5),
        ({"eval_engine": "hf", "eval_gpus_per_worker": 1}, "hf", 1.0),  # the hf engine on GPU actors
    ],
)
def test_the_engine_and_its_gpus_reach_the_eval_settings(given, engine, gpus, tmp_path):
    for params in (PipelineParams(**given), EvalParams(model_dir="/m", **given)):
        settings = settings_of(params, run_context(tmp_path))
        assert (settings.eval_engine, settings.eval_gpus_per_worker) == (engine, gpus)


def settings_of(params, run):
    """What the flows build: the run's parameters on its eval set, in its training's context mode."""
    return eval_settings(params, run.eval_set, run.train_config)


def run_context(tmp_path, train_config=None):
    from tasks.context import RunContext

    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")  # the cache key fingerprints the directory's files
    return RunContext(
        "r", "f", tmp_path / "root", "sqlite://", "http://h:1", model, "maze256-small-v1", {}, "p", train_config
    )


def test_a_pipeline_run_evaluates_in_the_context_mode_it_trains_in(tmp_path):
    # Given a run whose training overrides the starter's context mode,
    from mazerl.training.config import TrainConfig

    trained = TrainConfig(run_id="r", base_model=tmp_path, history_images=1, history_text=0)
    run = run_context(tmp_path, trained)
    # when its eval settings are built, then both evals use the training's mode,
    settings = settings_of(PipelineParams(), run)
    assert (settings.history_images, settings.history_text) == (1, 0)
    # an eval-only run leaves the mode to the model's record,
    assert settings_of(EvalParams(model_dir="/m"), run_context(tmp_path)).history_text is None
    # and another mode is another baseline (the cache key changes with it)
    key = lambda s: baseline_cache_key(None, {"run": run, "settings": s})  # noqa: E731
    assert key(settings) != key(settings_of(PipelineParams(), run_context(tmp_path)))


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"eval_engine": "vllm", "eval_gpus_per_worker": 0}, "vLLM runs on GPUs only"),
        ({"eval_gpus_per_worker": 1.5}, "whole number"),
        ({"eval_gpus_per_worker": -1}, "eval_gpus_per_worker"),
        ({"eval_engine": "sglang"}, "eval_engine"),
    ],
)
def test_bad_engine_settings_are_refused_naming_the_parameter(given, says):
    with pytest.raises(ValidationError, match=says):
        PipelineParams(**given)


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"eval_engine": "vllm", "eval_gpus_per_worker": 0}, "vLLM runs on GPUs only"),
        ({"eval_gpus_per_worker": 1.5}, "whole number"),
    ],
)
def test_an_eval_called_directly_refuses_the_same_gpus_with_the_same_words(given, says, tmp_path):
    from mazerl.evaluation.evaluate import evaluate
    from mazerl.starter.shipped import shipped_starter

    # `mazerl eval` and library callers build EvalSettings themselves: the parameters' rule holds there too,
    # before anything is written.
    with pytest.raises(ValueError, match=says):
        evaluate(shipped_starter(), EvalSettings(eval_set="maze256-small-v1", **given), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_gpus_per_worker_is_placement_not_a_result_so_the_baseline_cache_ignores_it(tmp_path):
    run = run_context(tmp_path)
    on_cpu = EvalSettings(eval_set="maze256-small-v1", eval_engine="hf", eval_gpus_per_worker=0.0)
    on_gpu = EvalSettings(eval_set="maze256-small-v1", eval_engine="hf", eval_gpus_per_worker=1.0)
    vllm = EvalSettings(eval_set="maze256-small-v1", eval_engine="vllm", eval_gpus_per_worker=1.0)
    key = lambda s: baseline_cache_key(None, {"run": run, "settings": s})  # noqa: E731
    assert key(on_cpu) == key(on_gpu), "where the workers run does not change the baseline's results"
    assert key(vllm) != key(on_gpu), "another engine is another baseline"


@pytest.mark.parametrize(
    ("mazes", "workers", "sizes"),
    [
        (64, 6, [11, 11, 11, 11, 11, 9]),  # the hyperpod eval: all 6 GPU workers busy (chunks of 32 used 2)
        (256, 2, [32] * 8),  # the embedded eval: at most 32 mazes per chunk, as before
        (16, 2, [8, 8]),  # the smoke preset
        (3, 6, [1, 1, 1]),  # fewer mazes than workers: one maze each, the rest stay idle
    ],
)
def test_eval_chunks_give_every_worker_one_and_cover_every_maze_once(mazes, workers, sizes):
    from mazerl.evaluation.evaluate import eval_chunks

    chunks = eval_chunks(mazes, workers)
    assert [len(chunk) for chunk in chunks] == sizes
    assert [i for chunk in chunks for i in chunk] == list(range(mazes)), "every maze once, in set order"
    assert eval_chunks(mazes, workers, chunk_size=4)[0] == list(range(min(4, mazes))), "an explicit size is kept"


def test_the_worker_count_reaches_the_baseline_cache_only_through_the_chunking_it_implies(tmp_path):
    from tasks.context import RunContext

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    run = RunContext("r", "f", tmp_path / "root", "sqlite://", "http://h:1", model, "maze64-easy-v1", {}, "p")
    key = lambda workers: baseline_cache_key(  # noqa: E731
        None, {"run": run, "settings": EvalSettings(eval_set="maze64-easy-v1", eval_workers=workers)}
    )
    # 64 mazes: 2 and 1 workers both play chunks of 32, 6 workers chunks of 11 (another batching, maybe other replies)
    assert key(2) == key(1) and key(6) != key(2)


def test_the_settings_keep_the_parameters_names_and_cross_to_the_eval_job_unchanged(tmp_path):
    # Given the settings a pipeline run's parameters ask for,
    params = PipelineParams(eval_workers=3, max_eval_mazes=16, gif_count=1, eval_engine="hf")
    settings = settings_of(params, run_context(tmp_path))
    # then each field is the parameter of the same name,
    for name in ("eval_workers", "max_eval_mazes", "gif_count", "eval_engine"):
        assert getattr(settings, name) == getattr(params, name), name
    # and the eval job reads back exactly the settings written into its request, paths made absolute
    request = eval_request("model", settings, "out")
    assert read_eval_request(request)["settings"] == settings
    assert request["model_dir"].startswith("/") and request["out_dir"].startswith("/")


@pytest.mark.parametrize(
    ("request_", "says"),
    [
        ({"model_dir": "/m", "out_dir": "/o", "adapter": None}, "settings"),
        ({"model_dir": "/m", "out_dir": "/o", "adapter": None, "settings": {"eval_set": "x", "workers": 2}}, "workers"),
        ({"model_dir": "/m", "out_dir": "/o", "adapter": None, "settings": {}}, "eval_set is missing"),
    ],
)
def test_a_malformed_eval_request_is_refused_naming_what_is_wrong(request_, says):
    with pytest.raises(ValueError, match=says):
        read_eval_request(request_)
