"""GRPO training: one interface, two backends (``local``, ``skyrl``), both Ray jobs.

- ``config`` (``TrainConfig``, ``TrainingConfigError``), ``recipes`` (the named recipes ``embedded`` /
  ``defaults`` and ``resolve_train_config``, the one place a config is built from a recipe and overrides),
  ``run_config`` (the run directory's ``train_config.json``, and the refusal of an edited one);
- ``data`` (each step's mazes from the pool), ``grpo`` (advantages, loss, mini-batches), ``credit`` (each
  turn's advantage by ``grpo.credit``: episode, turn, anchor), ``scoring`` (the packed scorer),
  ``lr_schedule`` (the rate as a function of the step), ``seeding`` (a seed per step);
- ``checkpoints`` (layout, marker, verified resume, damaged steps passed over), ``disk_room`` (room for
  the next checkpoint: a full disk pauses a run), ``trainer_lock`` (one trainer per run directory);
- ``progress`` (``TrainingProgress``: the furthest step, from the job's lines and the marker),
  ``metrics_sink`` (what a trainer hands each step's metrics to);
- the local engine: ``local_trainer``, ``lora_adapter``, its Ray job ``python -m mazerl.training.local_entry``;
- the SkyRL backend: ``skyrl_backend``, ``skyrl_schema``, its Ray job ``python -m mazerl.training.skyrl_entry``;
- ``per_turn_oracle``: the slow scorer the packed one is proved against.
"""
