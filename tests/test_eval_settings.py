"""The eval-engine parameters (eval_engine, eval_gpus_per_worker) from the flows' parameters to the eval job."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from mazerl.params import EvalParams, PipelineParams
from tasks.evaluation import EvalSettings, baseline_cache_key


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
        settings = EvalSettings.of(params, run_context(tmp_path))
        assert (settings.engine, settings.gpus_per_worker) == (engine, gpus)


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
    settings = EvalSettings.of(PipelineParams(), run)
    assert (settings.history_images, settings.history_text) == (1, 0)
    # an eval-only run leaves the mode to the model's record,
    assert EvalSettings.of(EvalParams(model_dir="/m"), run_context(tmp_path)).history_text is None
    # and another mode is another baseline (the cache key changes with it)
    key = lambda s: baseline_cache_key(None, {"run": run, "settings": s})  # noqa: E731
    assert key(settings) != key(EvalSettings.of(PipelineParams(), run_context(tmp_path)))


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


def test_gpus_per_worker_is_placement_not_a_result_so_the_baseline_cache_ignores_it(tmp_path):
    run = run_context(tmp_path)
    on_cpu = EvalSettings(eval_set="maze256-small-v1", engine="hf", gpus_per_worker=0.0)
    on_gpu = EvalSettings(eval_set="maze256-small-v1", engine="hf", gpus_per_worker=1.0)
    vllm = EvalSettings(eval_set="maze256-small-v1", engine="vllm", gpus_per_worker=1.0)
    key = lambda s: baseline_cache_key(None, {"run": run, "settings": s})  # noqa: E731
    assert key(on_cpu) == key(on_gpu), "where the workers run does not change the baseline's results"
    assert key(vllm) != key(on_gpu), "another engine is another baseline"
