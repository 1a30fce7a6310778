"""mazerl: library code for the maze GRPO pipeline (no Prefect imports here).

Sub-packages run inside Ray jobs as well as in the orchestrator: ``policy`` (model loading,
chat rendering, inference engines, episodes), ``starter`` (the tiny Qwen3-VL starter),
``evaluation`` (the eval stage), ``training`` (configs, GRPO math, checkpoints, both backends),
``merge`` (the LoRA merge and its proofs), ``cluster`` (Ray: the local head, job submission,
readiness checks), ``tracking`` (MLflow only: store, run tree, metrics, registry) and
``reporting`` (the pipeline's outcomes in MLflow, promotion). The modules beside them are
small helpers (paths, atomic writes, progress lines) and the pipeline's inputs (``params``), which
the ``preflight`` package checks before a stage starts. docs/architecture.md has the table and the
import rules.
"""

from mazerl import upstream_warnings

upstream_warnings.install()
