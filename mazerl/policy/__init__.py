"""The policy runtime: what plays the mazes, in training, in the evals and on the cluster.

- ``loader``: ``load_policy`` for any Qwen3-VL directory, and the adapter checks;
- ``chat``: the one place prompts are rendered; ``context_mode``: ``history_images`` / ``history_text``
  and their one check (no torch);
- ``engines`` (``InferenceEngine``, the ``hf`` engine), ``prefix_engine`` (the trainer's), ``vllm_engine``
  (the cluster's), ``vision_cache``, ``attention``;
- ``episodes``: the multi-turn runner and the rollout's metrics.
"""
