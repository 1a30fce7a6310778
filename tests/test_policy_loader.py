"""Model loading (mazerl.policy.loader): round trip, processor, adapters and every refusal."""

import json
import shutil

import pytest
import torch

from envs.maze import MazeEnv
from mazerl.policy.loader import ModelLoadError, load_policy, load_processor

# Transformers' loading and the PEFT adapter checks, on the versions the image ships too (`make test-image-stack`).
pytestmark = pytest.mark.image_stack


@pytest.fixture(scope="module")
def policy(starter_model_dir):
    return load_policy(starter_model_dir, device="cpu")


def test_starter_round_trip_gives_a_qwen3_vl_in_float32_on_cpu(policy, starter_model_dir):
    # given the saved starter, when loaded
    # then it is the stock architecture with its processor, in eval mode, float32 on CPU
    from transformers import Qwen3VLForConditionalGeneration, Qwen3VLProcessor

    assert isinstance(policy.model, Qwen3VLForConditionalGeneration)
    assert isinstance(policy.processor, Qwen3VLProcessor)
    assert policy.dtype == torch.float32 and policy.device.type == "cpu"
    assert not policy.model.training
    assert policy.model_dir == starter_model_dir.resolve()


def test_saved_weights_reload_identically(policy, starter_model_dir, tmp_path):
    # given the loaded model saved again, when reloaded, then every tensor is equal
    policy.model.save_pretrained(tmp_path / "copy")
    for name in ("tokenizer.json", "tokenizer_config.json", "preprocessor_config.json", "chat_template.jinja"):
        shutil.copy(starter_model_dir / name, tmp_path / "copy" / name)
    again = load_policy(tmp_path / "copy", device="cpu")
    for (name, a), (_, b) in zip(policy.model.state_dict().items(), again.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), f"tensor {name} changed in the save/load round trip"


def test_processor_produces_the_image_tokens_the_model_expects(policy):
    # given a frame of the embedded world and the chat template
    processor, model = policy.processor, policy.model
    frame, _ = MazeEnv(size=7, cell_px=16).reset(seed=0)
    messages = [{"role": "user", "content": [{"type": "text", "text": "maze"}, {"type": "image"}]}]
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    # when the stock processor call prepares it
    inputs = processor(text=[text], images=[frame], return_tensors="pt")
    # then there is one image token per patch, with the model's image token id, and the forward runs
    image_tokens = int((inputs["input_ids"] == model.config.image_token_id).sum())
    assert image_tokens == int(inputs["image_grid_thw"].prod()) == 49
    with torch.no_grad():
        logits = model(**inputs).logits
    assert logits.shape[-1] == model.config.text_config.vocab_size
    assert torch.isfinite(logits).all()


def test_stock_video_processor_config_is_present_for_machines_with_torchvision(starter_model_dir):
    # the directory is stock-format: a GPU machine (torchvision, vLLM) builds the full Qwen3VLProcessor
    config = json.loads((starter_model_dir / "video_preprocessor_config.json").read_text())
    assert config["video_processor_type"] == "Qwen3VLVideoProcessor"
    assert config["merge_size"] == 1 and config["patch_size"] == 16
    assert (
        json.loads((starter_model_dir / "processor_config.json").read_text())["processor_class"] == "Qwen3VLProcessor"
    )


def copy_without(source, target, *names):
    shutil.copytree(source, target)
    for name in names:
        (target / name).unlink()
    return target


@pytest.mark.parametrize(
    ("missing", "message"),
    [
        (("config.json",), "no config.json"),
        (("tokenizer.json", "tokenizer_config.json"), "no tokenizer files"),
        (("preprocessor_config.json", "processor_config.json"), "no image processor config"),
        (("chat_template.jinja",), "no chat template"),
    ],
)
def test_incomplete_directories_are_refused_with_the_missing_files(starter_model_dir, tmp_path, missing, message):
    broken = copy_without(starter_model_dir, tmp_path / "broken", *missing)
    with pytest.raises(ModelLoadError, match=message):
        load_policy(broken, device="cpu")


def test_missing_directory_is_refused_with_the_fix(tmp_path):
    with pytest.raises(ModelLoadError, match="build-starter"):
        load_policy(tmp_path / "nowhere")


def test_a_text_only_model_is_refused(tmp_path, starter_model_dir):
    # given a directory whose config is a text-only causal LM (processor files present)
    from transformers import LlamaConfig

    directory = copy_without(starter_model_dir, tmp_path / "llama", "config.json")
    LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64).save_pretrained(
        directory
    )
    with pytest.raises(ModelLoadError, match="not an image-text-to-text"):
        load_policy(directory, device="cpu")


def save_lora(model, directory):
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    for name, parameter in peft_model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.5)  # a non-zero adapter, so it changes outputs
    peft_model.save_pretrained(directory)
    return directory


def test_a_fitting_adapter_loads_and_changes_the_outputs(starter_model_dir, policy, tmp_path):
    # given a LoRA adapter made on the starter itself
    base = load_policy(starter_model_dir, device="cpu").model
    adapter = save_lora(base, tmp_path / "adapter")
    # when loaded on top of the starter
    adapted = load_policy(starter_model_dir, adapter_dir=adapter, device="cpu")
    merged = load_policy(starter_model_dir, adapter_dir=adapter, device="cpu", merge_adapter=True)
    # then the adapter is applied (different logits), and merging gives the same function
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        plain = policy.model(input_ids=ids).logits
        lora = adapted.model(input_ids=ids).logits
        folded = merged.model(input_ids=ids).logits
    assert adapted.adapter_dir == adapter.resolve()
    assert not torch.allclose(plain, lora), "the adapter should change the logits"
    assert torch.allclose(lora, folded, atol=1e-4), "merged and unmerged adapters should agree"


def test_an_adapter_for_another_base_is_refused(starter_model_dir, tmp_path):
    # given an adapter trained on a model with another width
    from transformers import Qwen3VLForConditionalGeneration

    from mazerl.policy.loader import load_processor
    from mazerl.starter.build import model_config
    from mazerl.starter.config import StarterConfig

    other = StarterConfig(text_hidden=64, text_heads=2, vision_hidden=64)
    model = Qwen3VLForConditionalGeneration(model_config(other, load_processor(starter_model_dir).tokenizer))
    adapter = save_lora(model, tmp_path / "other-adapter")
    # then loading it on the starter names the mismatch
    with pytest.raises(ModelLoadError, match="different base model"):
        load_policy(starter_model_dir, adapter_dir=adapter, device="cpu")


def test_an_adapter_directory_without_weights_is_refused(starter_model_dir, tmp_path):
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text("{}")
    with pytest.raises(ModelLoadError, match="adapter_model.safetensors"):
        load_policy(starter_model_dir, adapter_dir=tmp_path / "adapter", device="cpu")


def test_processor_loads_without_torchvision_as_the_qwen3_vl_processor_class(starter_model_dir):
    from transformers import Qwen3VLProcessor
    from transformers.utils import is_torchvision_available

    processor = load_processor(starter_model_dir)
    assert isinstance(processor, Qwen3VLProcessor)
    assert processor.image_processor.merge_size == 1
    if not is_torchvision_available():
        assert not hasattr(processor, "video_processor"), "without torchvision the video processor is left out"
