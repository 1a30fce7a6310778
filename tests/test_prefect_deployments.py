"""prefect.yaml: every deployment points at a real flow, its parameters validate, its schedule parses."""

import importlib
import re
from pathlib import Path

import pytest
import yaml
from prefect import Flow
from prefect.client.schemas.schedules import CronSchedule

from mazerl.params import PipelineParams

PREFECT_YAML = Path(__file__).parents[1] / "prefect.yaml"
PLACEHOLDER = re.compile(r"\{\{\s*\$(\w+)\s*\}\}")
FAKE_ENV = {
    "AWS_REGION": "us-west-2",
    "MLFLOW_TRACKING_URI": "http://mlflow.mazerl.svc.cluster.local:5000",
    "HYPERPOD_CLUSTER_NAME": "ml-cluster",
    "MAZERL_IMAGE": "123456789012.dkr.ecr.us-west-2.amazonaws.com/mazerl:0.1.0",
    "MAZERL_PROJECT_DIR": "/opt/mazerl",
}


def filled(value):
    """The deployment as `prefect deploy` renders it with the documented environment."""
    if isinstance(value, str):
        return PLACEHOLDER.sub(lambda m: FAKE_ENV[m.group(1)], value)
    if isinstance(value, dict):
        return {k: filled(v) for k, v in value.items()}
    if isinstance(value, list):
        return [filled(v) for v in value]
    return value


def deployments():
    return filled(yaml.safe_load(PREFECT_YAML.read_text()))["deployments"]


def test_local_and_hyperpod_deployments_exist():
    names = {d["name"]: d for d in deployments()}
    assert set(names) == {"local", "hyperpod"}
    assert names["local"]["work_pool"]["name"] == "mazerl-local"
    assert names["hyperpod"]["work_pool"]["name"] == "mazerl-hyperpod"
    assert names["hyperpod"]["work_pool"]["job_variables"]["env"]["MAZERL_HOME"] == "/shared"


@pytest.mark.parametrize("deployment", deployments(), ids=lambda d: d["name"])
def test_entrypoint_is_a_flow_and_parameters_validate(deployment):
    module_path, _, name = deployment["entrypoint"].partition(":")
    module = importlib.import_module(module_path.removesuffix(".py").replace("/", "."))
    assert isinstance(getattr(module, name), Flow)
    params = PipelineParams.model_validate(deployment["parameters"]["params"])
    if deployment["name"] == "hyperpod":
        assert params.backend == "skyrl" and params.data_root == "/shared"
        config = params.train_config("r", Path("/shared/models/x"))
        gpus = config.skyrl.num_gpus * config.skyrl.num_nodes
        episodes = config.mazes_per_step * config.grpo.samples_per_maze
        assert episodes % gpus == 0, f"{episodes} episodes per step must split over {gpus} GPUs"
        assert params.eval_engine == "vllm" and params.resolved_eval_gpus() == 1, "8B evals run on GPU actors"
        assert params.eval_workers * params.resolved_eval_gpus() <= gpus, "all eval workers fit on the GPU nodes"


@pytest.mark.parametrize("deployment", deployments(), ids=lambda d: d["name"])
def test_schedules_are_valid_and_inactive_by_default(deployment):
    for schedule in deployment["schedules"]:
        CronSchedule(cron=schedule["cron"], timezone=schedule["timezone"])  # Prefect's own validation
        assert schedule["active"] is False


def test_every_placeholder_is_documented():
    documented = (Path(__file__).parents[1] / "docs" / "hyperpod.md").read_text() + (
        Path(__file__).parents[1] / "README.md"
    ).read_text()
    for name in set(PLACEHOLDER.findall(PREFECT_YAML.read_text())):
        assert name in documented, f"{name} is used in prefect.yaml but documented nowhere"


def test_the_run_form_lists_every_training_field_with_its_description():
    from prefect.utilities.callables import parameter_schema
    from prefect.utilities.schema_tools.validation import is_valid, is_valid_schema

    from flows.pipeline import pipeline
    from mazerl.training.config import TrainConfig
    from mazerl.training.recipes import PIPELINE_SET_TRAINING_FIELDS

    # Given the parameter schema Prefect stores with a deployment (what the UI's run form renders),
    schema = parameter_schema(pipeline).model_dump(by_alias=True)
    is_valid_schema(schema)
    training = schema["definitions"]["PipelineParams"]["properties"]["training"]
    # then `training` is an object whose fields are the overridable TrainConfig fields, each described,
    overridable = set(TrainConfig.model_fields) - set(PIPELINE_SET_TRAINING_FIELDS)
    assert set(training["properties"]) == overridable
    for name, field in training["properties"].items():
        assert field.get("description"), f"training.{name} has no description in the run form"
    assert "rank" in training["properties"]["lora"]["properties"], "nested settings list their own fields"

    # with no defaults the form would pre-fill (and send as overrides of the embedded recipe), none required,
    def keys(node):
        if isinstance(node, dict):
            yield from node
            for value in node.values():
                yield from keys(value)
        elif isinstance(node, list):
            for value in node:
                yield from keys(value)

    assert not {"default", "required"} & set(keys(training["properties"]))
    # and what the form sends is checked by the schema and then by the pipeline, naming the field.
    params = {"params": {"training": {"steps": 3, "lora": {"rank": 8}}}}
    assert is_valid(params, schema) and PipelineParams.model_validate(params["params"]).training["steps"] == 3
    assert not is_valid({"params": {"training": {"steps": "many"}}}, schema)
    with pytest.raises(ValueError, match=r"training\.steps"):
        PipelineParams.model_validate({"training": {"steps": 0}})
