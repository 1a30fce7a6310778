"""Credentials never reach MLflow: name and value filters, then a grep of the whole store after a run."""

import json
from pathlib import Path

import pytest

from mazerl import paths
from mazerl.tracking import artifacts, evals, lineage
from mazerl.tracking.secrets import REDACTED, SecretLeakError, find_secrets, is_secret_name, redact, scrub_text

# Fake credentials in the shapes the real ones have (none of them is valid anywhere).
FAKE_ENV = {
    "AWS_ACCESS_KEY_ID": "AKIAZZZZFAKEKEY12345",
    "AWS_SECRET_ACCESS_KEY": "fakeSecretAccessKey/0123456789abcdefghijABCDEFG",
    "AWS_SESSION_TOKEN": "FwoGZXIvYXdzEFAKESESSIONTOKENxyz0123456789",
    "RAY_AUTH_TOKEN": "ray-fake-auth-token-0123456789",
    "MLFLOW_TRACKING_PASSWORD": "mlflow-fake-password-42",
    "MLFLOW_TRACKING_TOKEN": "mlflow-fake-bearer-token-77",
    "HF_TOKEN": "hf_fakefakefakefakefakefake",
}


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("AWS_ACCESS_KEY_ID", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("AWS_SESSION_TOKEN", True),
        ("RAY_AUTH_TOKEN", True),
        ("MLFLOW_TRACKING_TOKEN", True),
        ("MLFLOW_TRACKING_PASSWORD", True),
        ("db_passwd", True),
        ("apiKey", True),
        ("openai_api_key", True),
        ("credentials", True),
        ("storage.secret", True),
        ("max_new_tokens", False),
        ("response_tokens", False),
        ("tokenizer_path", False),
        ("monkey_patch", False),
        ("keyword_format", False),
        ("base_model", False),
        ("MLFLOW_TRACKING_URI", False),
    ],
)
def test_secret_names(name, secret):
    assert is_secret_name(name) is secret, f"{name}: expected secret={secret}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("key AKIAZZZZFAKEKEY12345 here", "key *** here"),
        ("postgresql://mlflow:hunter2secret@db:5432/mlflow", "postgresql://mlflow:***@db:5432/mlflow"),
        ("https://example.com/path?x=1", "https://example.com/path?x=1"),
        ("token: ray-fake-auth-token-0123456789.", "token: ***."),
        ("plain text stays", "plain text stays"),
    ],
)
def test_scrub_text(text, expected):
    assert scrub_text(text, environ=FAKE_ENV) == expected


def test_redact_masks_by_name_and_by_value():
    out = redact(
        {
            "aws_secret_access_key": "anything",
            "note": f"uses {FAKE_ENV['HF_TOKEN']}",
            "max_new_tokens": 12,
            "token": "",
        },
        environ=FAKE_ENV,
    )
    assert out == {"aws_secret_access_key": REDACTED, "note": "uses ***", "max_new_tokens": "12", "token": ""}


def test_short_or_boolean_env_values_are_not_treated_as_secrets():
    environ = {"USE_TOKEN": "1", "RAY_AUTH_MODE_KEY": "token", "SOME_KEY": "true"}
    assert scrub_text("step 1 uses token auth: true", environ=environ) == "step 1 uses token auth: true"


def store_files(root: Path):
    return [path for path in root.rglob("*") if path.is_file()]


def test_no_secret_reaches_the_store(mlflow_root, tmp_path, monkeypatch):
    # given fake credentials in the environment, in the flow parameters and in the files to log
    for name, value in FAKE_ENV.items():
        monkeypatch.setenv(name, value)
    uri = paths.mlflow_db_uri(mlflow_root)
    params = {
        "aws": {"access_key_id": FAKE_ENV["AWS_ACCESS_KEY_ID"], "region": "us-west-2"},
        "storage_uri": f"s3://bucket/data?token={FAKE_ENV['AWS_SESSION_TOKEN']}",
        "tracking_uri": f"https://user:{FAKE_ENV['MLFLOW_TRACKING_PASSWORD']}@mlflow.example.com",
        "environment": dict(FAKE_ENV),
        "grpo": {"max_new_tokens": 12},
    }
    config = tmp_path / "train_config.json"
    config.write_text(json.dumps({"steps": 2, "ray_token": FAKE_ENV["RAY_AUTH_TOKEN"], "note": FAKE_ENV["HF_TOKEN"]}))
    eval_dir = tmp_path / "eval"
    eval_dir.mkdir()
    (eval_dir / "results.jsonl").write_text(json.dumps({"maze_id": "s/0", "solved": False, "moves": 3}) + "\n")
    (eval_dir / "summary.json").write_text(
        json.dumps(
            {"success_rate": 0.0, "parse_failure_rate": 0.0, "model": f"s3://x?sig={FAKE_ENV['AWS_SECRET_ACCESS_KEY']}"}
        )
    )
    # when a pipeline run logs params, tags, the config and an eval report
    runs = lineage.start_pipeline_run(
        uri, tags={"launched_by": f"ci {FAKE_ENV['MLFLOW_TRACKING_TOKEN']}", "api_key": "abc12345678"}, params=params
    )
    artifacts.log_config_file(uri, runs.run_id("train"), config)
    evals.log_eval_report(uri, runs.run_id("final_eval"), eval_dir)
    # then no fake credential is anywhere in the database or the artifact store
    files = store_files(mlflow_root)
    assert any(path.name == "train_config.json" for path in files), "the config should have been logged"
    for path in files:
        content = path.read_bytes()
        for name, value in FAKE_ENV.items():
            assert value.encode() not in content, f"${name} leaked into {path}"
        assert b"abc12345678" not in content, f"the api_key tag leaked into {path}"
    # and the ordinary values are still there
    from mlflow.tracking import MlflowClient

    logged = MlflowClient(uri).get_run(runs.parent_run_id).data.params
    assert logged["grpo.max_new_tokens"] == "12" and logged["aws.region"] == "us-west-2"
    assert logged["aws.access_key_id"] == REDACTED


def test_directory_with_a_credential_is_refused(mlflow_root, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", FAKE_ENV["AWS_SECRET_ACCESS_KEY"])
    uri = paths.mlflow_db_uri(mlflow_root)
    model = tmp_path / "merged"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"note": FAKE_ENV["AWS_SECRET_ACCESS_KEY"]}))
    run_id = lineage.start_pipeline_run(uri).run_id("merge_lora")
    with pytest.raises(SecretLeakError, match=r"AWS_SECRET_ACCESS_KEY") as failure:
        artifacts.check_no_secrets(model)  # what write_mlflow_model checks before it logs the merged model
    assert FAKE_ENV["AWS_SECRET_ACCESS_KEY"] not in str(failure.value), "the error must not print the secret"
    assert not (mlflow_root / "mlartifacts" / run_id / "artifacts" / "merged_model").exists()


def weights_file(path: Path, raw: bytes, metadata: dict[str, str] | None = None) -> Path:
    """A safetensors file whose one uint8 tensor holds exactly ``raw`` (as a merged model's weights might)."""
    import torch
    from safetensors.torch import save_file

    save_file({"weight": torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone()}, path, metadata=metadata)
    return path


def test_weights_whose_bytes_spell_a_url_password_are_not_a_credential(tmp_path):
    # A merged starter's 8.6 MB of weights once held 'F://9A":P...:r=af<...@' by chance, and the scan of
    # their bytes as text refused to log the model: tensor bytes and binary files are not text.
    chance = b"\x00\x91F://9A\x10:r=af\xd8\x96<@\x00\x07" + bytes(range(256)) + b"AKIAZZZZFAKEKEY12345"
    model = tmp_path / "merged"
    model.mkdir()
    weights_file(model / "model.safetensors", chance)
    (model / "optimizer.bin").write_bytes(chance)
    (model / "config.json").write_text(json.dumps({"model_type": "qwen3_vl"}))

    artifacts.check_no_secrets(model)  # nothing to refuse


def test_a_credential_in_weights_metadata_or_a_text_file_is_still_found(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", FAKE_ENV["HF_TOKEN"])
    weights = weights_file(
        tmp_path / "model.safetensors", b"\x00" * 64, metadata={"source": "https://user:hunter2pw@example.com/model"}
    )
    text = tmp_path / "README.md"
    text.write_text(f"pulled with {FAKE_ENV['HF_TOKEN']}\n")

    found = find_secrets([weights, text])

    assert found == [f"{weights}: a password in a URL", f"{text}: the value of $HF_TOKEN"]
