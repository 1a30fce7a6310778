"""GRPO training: config, GRPO math, checkpoints, and the two backends (local, skyrl)."""
