"""``mazerl run --preset smoke``: named defaults under the flags, the same in a deployment's parameters."""

from __future__ import annotations

import argparse
import json

import pytest

from cli.run import add_run_command, build_params
from mazerl.params import PipelineParams
from mazerl.training.config import TrainConfig
from mazerl.training.recipes import EMBEDDED_TRAINING, MINIATURE_TRAINING


def run_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_run_command(parser.add_subparsers(dest="command"))
    return parser.parse_args(["run", *argv])


def test_the_smoke_preset_is_the_miniature_recipe_and_a_small_eval():
    params = build_params(run_args("--preset", "smoke"))
    assert params.training == MINIATURE_TRAINING and params.max_eval_mazes == 16
    config = params.train_config("r", params.root() / "models" / "x")
    assert (config.steps, config.mazes_per_step, config.grpo.samples_per_maze) == (2, 1, 2)


def test_flags_and_the_parameters_file_override_the_preset_field_by_field(tmp_path):
    # Given the preset and a parameters file and flags that change some of its fields,
    params_file = tmp_path / "params.json"
    params_file.write_text(json.dumps({"training": {"grpo": {"temperature": 1.0}}, "max_eval_mazes": 8}))
    params = build_params(run_args("--preset", "smoke", "--params", str(params_file), "--steps", "3"))
    # then what was given wins, and every other preset field stays (nested fields included).
    assert params.training["steps"] == 3 and params.max_eval_mazes == 8
    assert params.training["grpo"] == MINIATURE_TRAINING["grpo"] | {"temperature": 1.0}
    assert params.training["lora"] == MINIATURE_TRAINING["lora"]


def test_a_deployment_names_the_preset_in_its_parameters_and_an_unknown_one_is_refused():
    assert PipelineParams.model_validate({"preset": "smoke"}).training == MINIATURE_TRAINING
    # a dumped run's parameters (what Prefect stores) read back to the same run
    params = PipelineParams.model_validate({"preset": "smoke", "training": {"steps": 3}})
    assert PipelineParams.model_validate(params.model_dump()) == params
    with pytest.raises(ValueError, match="preset"):
        PipelineParams.model_validate({"preset": "fast"})
    with pytest.raises(SystemExit):
        run_args("--preset", "fast")


def test_the_recipe_is_a_parameter_whose_default_is_the_automatic_choice(tmp_path):
    # Given no recipe, the starter on the local backend trains with the embedded recipe and any other model
    # with TrainConfig's defaults (as before the recipe was a parameter),
    assert PipelineParams().recipe is None and PipelineParams().training_recipe() == "embedded"
    given_model = PipelineParams(base_model=str(tmp_path))
    assert given_model.training_recipe() == "defaults"
    assert given_model.train_config("r", tmp_path).learning_rate == TrainConfig.model_fields["learning_rate"].default
    # a named recipe wins over that choice, and the overrides still apply on top of it,
    embedded = PipelineParams(base_model=str(tmp_path), recipe="embedded", training={"steps": 7})
    config = embedded.train_config("r", tmp_path)
    assert (config.learning_rate, config.mazes_per_step, config.steps) == (
        EMBEDDED_TRAINING["learning_rate"],
        EMBEDDED_TRAINING["mazes_per_step"],
        7,
    )
    defaults = PipelineParams(recipe="defaults").train_config("r", tmp_path)
    assert defaults.mazes_per_step == TrainConfig.model_fields["mazes_per_step"].default
    assert defaults.grpo.update_epochs != EMBEDDED_TRAINING["grpo"]["update_epochs"]
    # and an unknown recipe is refused by name.
    with pytest.raises(ValueError, match="recipe"):
        PipelineParams.model_validate({"recipe": "huge"})
