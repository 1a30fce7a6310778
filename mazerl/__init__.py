"""mazerl: library code for the maze GRPO pipeline (no Prefect imports here).

Sub-packages run inside Ray jobs as well as in the orchestrator: ``policy`` (model loading,
inference engines, episodes, the tiny starter), ``evaluation``, ``training`` (configs,
GRPO math, checkpoints, trainers), ``cluster`` (Ray, job submission, readiness checks),
``tracking`` (MLflow lineage, merge and promotion).
"""

from mazerl import upstream_warnings

upstream_warnings.install()
