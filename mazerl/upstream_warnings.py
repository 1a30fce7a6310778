"""Warnings of our dependencies about each other that a user can do nothing about, silenced by exact text.

Each filter names the one message, the library that triggers it and when it can go; nothing
broader is silenced, so real warnings (ours, or a library's about how we call it) still show.
Imported by ``mazerl/__init__.py``, so every process that runs our code (the flow, Ray jobs
and their workers) has them.
"""

from __future__ import annotations

import logging
import warnings

# peft (0.21) asks every model it wraps for ``is_gradient_checkpointing``, which transformers 5
# deprecated in favour of ``is_activation_checkpointing``: two FutureWarnings per training job.
# Remove when peft reads the new property.
GRADIENT_CHECKPOINTING_MESSAGE = r"`is_gradient_checkpointing` is deprecated"


# sagemaker-mlflow (0.5.0, in the cluster image) registers a request-header provider that is "in context"
# for every tracking URI and parses the URI as an ARN, so with any other URI (a self-hosted server)
# MLflow logs this for every REST request. Remove when the plugin's provider checks the URI first.
SAGEMAKER_HEADER_MESSAGE = "Encountered unexpected error during resolving request headers: list index out of range"


class _NotAnArnTrackingUri(logging.Filter):
    """Drops the one message above, and only while the tracking URI is not a SageMaker ARN (then it is real)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage() != SAGEMAKER_HEADER_MESSAGE:
            return True
        import mlflow  # only reached once mlflow logged, so already imported

        return mlflow.get_tracking_uri().startswith("arn:")


def install() -> None:
    warnings.filterwarnings(
        "ignore", message=GRADIENT_CHECKPOINTING_MESSAGE, category=FutureWarning, module=r"transformers\."
    )
    logging.getLogger("mlflow.tracking.request_header.registry").addFilter(_NotAnArnTrackingUri())
