"""The merged model as an MLflow transformers model, on the reduced starter and a real SQLite store.

Round trip: log -> register -> ``mlflow.transformers.load_model("models:/maze-vlm@champion")`` gives
the same model (logits on a real maze prompt) with the PIL image processor (no torchvision here);
above ``max_artifact_mb`` the weights stay where they are and the registered model still loads.
"""

import json
from pathlib import Path

import mlflow.transformers
import pytest
import torch
from mlflow.models import Model
from mlflow.tracking import MlflowClient

from mazerl import paths
from mazerl.merge.proofs import probe_contexts
from mazerl.policy.loader import load_policy, load_processor
from mazerl.tracking import lineage, mlflow_model, registry
from mazerl.tracking.mlflow_model import input_example, write_mlflow_model


@pytest.fixture
def uri(mlflow_root):
    """The store, also as MLflow's current tracking URI: ``models:/`` URIs resolve against it."""
    uri = paths.mlflow_db_uri(mlflow_root)
    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    yield uri
    mlflow.set_tracking_uri(before)


def logits(model, processor, eval_set="maze256-small-v1"):
    """The model's logits on the probe prompts of the merge's proofs (real maze frames)."""
    from mazerl.policy.chat import model_inputs

    ids, images = probe_contexts(processor, eval_set)
    with torch.no_grad():
        return model(**model_inputs(processor, ids, images)).logits


def register(uri, tmp_path, model_dir, max_artifact_mb):
    merged = tmp_path / "merged"
    if not merged.exists():
        import shutil

        shutil.copytree(model_dir, merged)
        (merged / "merge_record.json").write_text(json.dumps({"logits_max_abs_diff": 1e-6, "checkpoint_step": 3}))
    # what the merge job writes beside the weights, then what the merge task uploads
    model = write_mlflow_model(
        merged,
        tmp_path / "mlflow_model",
        processor=load_processor(merged),
        eval_set="maze256-small-v1",
        max_artifact_mb=max_artifact_mb,
    )
    run_id = lineage.start_pipeline_run(uri).run_id("merge_lora")
    logged = mlflow_model.log_merged_model(uri, run_id, merged, model)
    registry.promote(uri, "maze-vlm", logged.source, run_id, baseline_success=0.1, final_success=0.3)
    return merged, run_id, logged


def test_registered_champion_loads_with_the_transformers_flavour(uri, mlflow_root, tmp_path, starter_model_dir):
    # given a merged model logged below the size limit and promoted to champion
    merged, run_id, logged = register(uri, tmp_path, starter_model_dir, max_artifact_mb=512)
    # logged as an MLflow 3 logged model of the merge run, whose files are the registered source
    client = MlflowClient(uri)
    model = client.get_logged_model(logged.model_id)
    artifact = mlflow_root / "mlartifacts" / "models" / logged.model_id / "artifacts"
    assert logged.uploaded and logged.source == model.artifact_location == artifact.as_uri()
    assert model.source_run_id == run_id and model.status == "READY"
    assert model.params["checkpoint_step"] == "3"
    assert [output.model_id for output in client.get_run(run_id).outputs.model_outputs] == [logged.model_id]
    assert (artifact / "model" / "model.safetensors").is_file(), "the weights are in the artifact"
    # then the registry holds an MLflow model: transformers flavour, signature, input example, no pyfunc
    mlmodel = Model.load(str(artifact))
    assert set(mlmodel.flavors) == {"transformers"}, "pyfunc cannot load an image-text-to-text model"
    flavor = mlmodel.flavors["transformers"]
    assert flavor["task"] == "image-text-to-text" and flavor["image_processor_type"] == "Qwen2VLImageProcessorPil"
    assert mlmodel.signature is not None and "messages" in mlmodel.signature.inputs.input_names()
    example = json.loads((artifact / "input_example.json").read_text())
    assert example == json.loads(json.dumps(input_example("maze256-small-v1")))
    assert example["messages"][0]["content"][-1]["image_url"]["url"].startswith("data:image/png;base64,")
    assert MlflowClient(uri).get_run(run_id).data.metrics == {"merge/logits_max_abs_diff": 1e-6}
    # when the champion is loaded with MLflow's transformers flavour (components: MLflow refuses a
    # pipeline for a model that needs a processor)
    components = mlflow.transformers.load_model("models:/maze-vlm@champion", return_type="components")
    # then it is the merged model, with a tokenizer that carries the chat template and the PIL image processor
    assert type(components["image_processor"]).__name__ == "Qwen2VLImageProcessorPil"
    assert components["tokenizer"].chat_template == load_processor(merged).chat_template
    policy = load_policy(merged)
    reference = logits(policy.model, policy.processor)
    loaded_dir = Path(components["model"].name_or_path)
    assert torch.equal(logits(components["model"].eval(), load_processor(loaded_dir)), reference)
    # and model/ is a complete Hugging Face directory for mazerl's own loader (mazerl eval --registered-model)
    assert Path(registry.model_version_dir(uri, "maze-vlm", "champion")) == artifact / "model"


def test_a_model_above_the_size_limit_keeps_its_weights_where_they_are(uri, mlflow_root, tmp_path, starter_model_dir):
    # given a merged model logged with max_artifact_mb=0 (every model counts as large)
    merged, run_id, logged = register(uri, tmp_path, starter_model_dir, max_artifact_mb=0)
    artifact = mlflow_root / "mlartifacts" / "models" / logged.model_id / "artifacts"
    assert not logged.uploaded
    assert not list(artifact.rglob("*.safetensors")), "no weights are copied into the tracking store"
    assert Model.load(str(artifact)).flavors["transformers"]["local_base_model_path"] == str(merged.resolve())
    assert MlflowClient(uri).get_run(run_id).data.tags["mazerl.merged_model_path"] == str(merged.resolve())
    # when the registered champion is loaded, its weights come from the merged directory
    components = mlflow.transformers.load_model("models:/maze-vlm@champion", return_type="components")
    policy = load_policy(merged)
    assert torch.equal(logits(components["model"].eval(), policy.processor), logits(policy.model, policy.processor))
    assert Path(registry.model_version_dir(uri, "maze-vlm", "champion")) == merged.resolve()
