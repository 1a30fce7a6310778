"""The embedded Ray head's environment, which every job's entrypoint inherits: an allow-list, with
token authentication and Ray's loopback-only mode switched on.

Jobs see only an allow-listed environment (:data:`JOB_ENV_ALLOWED`, plus the names a user
lists in ``MAZERL_JOB_ENV``): the head's processes start with it, so a cloud secret in the
user's shell never reaches a job's environment or what Ray records of it.

Every Ray process of the head binds to 127.0.0.1. ``--dashboard-host`` covers the dashboard
only; the GCS, raylet and agents bind to the node IP, which Ray on Linux resolves to the
machine's external address even when ``--node-ip-address 127.0.0.1`` is given. Ray's own
local-only mode (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, the default on macOS and Windows)
keeps the loopback address, so the head is started with it (tests check the listening
sockets). Token authentication is on (``RAY_AUTH_MODE=token``), with the token read from the
head's 0600 file (``RAY_AUTH_TOKEN_PATH``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# What a job needs from the environment that starts the head: where things are, locale,
# thread counts, devices, Hugging Face/torch caches and offline switches, certificates.
# Anything else (cloud credentials, tokens, proxies with passwords) stays out unless the user
# names it in MAZERL_JOB_ENV (comma-separated), e.g. MAZERL_JOB_ENV=MLFLOW_TRACKING_TOKEN.
JOB_ENV_ALLOWED = frozenset(
    {
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "PATH",
        "LANG",
        "LANGUAGE",
        "LC_ALL",
        "LC_CTYPE",
        "TZ",
        "TERM",
        "TMPDIR",
        "RAY_TMPDIR",
        "PYTHONPATH",
        "VIRTUAL_ENV",
        "MAZERL_HOME",
        "MAZERL_RAY_METRICS",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "TOKENIZERS_PARALLELISM",
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "CUDA_HOME",
        "MAZERL_VLLM_DEVICE",  # the vllm engine on vLLM's CPU build (mazerl.policy.vllm_engine), and its KV cache
        "VLLM_CPU_KVCACHE_SPACE",
        "HF_HOME",
        "HF_HUB_CACHE",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_DATASETS_OFFLINE",
        "TORCH_HOME",
        "XDG_CACHE_HOME",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
        "MLFLOW_HTTP_REQUEST_TIMEOUT",
    }
)
JOB_ENV_EXTRA_VAR = "MAZERL_JOB_ENV"


def job_environment(environ: dict[str, str] | os._Environ) -> dict[str, str]:
    """The part of ``environ`` a job may see: :data:`JOB_ENV_ALLOWED` and the names listed in MAZERL_JOB_ENV.

    Named, not filtered by pattern: an outer cluster's RAY_ADDRESS or token, cloud credentials
    and Hugging Face tokens stay out unless the user lists them.
    """
    extra = {name.strip() for name in environ.get(JOB_ENV_EXTRA_VAR, "").split(",") if name.strip()}
    return {name: value for name, value in environ.items() if name in JOB_ENV_ALLOWED or name in extra}


def head_env(token_path: Path, extra_env: dict[str, str] | None) -> dict[str, str]:
    """The head's environment, inherited by every job's entrypoint: the allow-listed part of this
    process's, this venv's python first on PATH (entrypoints say ``python -m ...``), token auth on,
    loopback-only node address."""
    env = job_environment(os.environ)
    env.update(
        {
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(token_path),
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            "RAY_USAGE_STATS_ENABLED": "0",
            # A SIGTERM'd head would first wait for its node to drain (meant for Serve on k8s);
            # a local head has nothing to drain, so stop at once.
            "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
        }
    )
    env.update(extra_env or {})
    return env
