"""Checks of a pipeline run's inputs that cost milliseconds and write nothing.

The first task of a pipeline run calls :func:`~mazerl.preflight.pipeline.check_pipeline_inputs` before it builds the
starter, starts Ray or opens MLflow runs, so a run with a bad input leaves nothing behind
but its own failed flow run (the error record). What ``PipelineParams`` cannot check
itself, because it is also validated where the files do not exist (a deployment's
parameters, the UI's form), is checked here on the machine that runs the flow:

- ``data_root``: the directory can be created and written by this user (tried, not guessed
  from permission bits: root passes ``os.access`` on ``/proc``), its names fit the file
  system, no control character; an empty ``MAZERL_HOME`` is refused, not read as ``./.mazerl``;
- ``eval_set``: the file loads and its digest verifies against the one pinned in code;
- ``base_model``: a Hugging Face vision-language model directory (config, weights whose
  safetensors headers match their sizes, tokenizer, processor; a Qwen3-VL ``model_type`` and
  architecture), every JSON file, the tokenizer and the chat template parsed, read without
  executing any code from it and without reading the weights. A path that does not exist here
  while the cluster is remote is left to ``verify_cluster``, which looks at it from a worker node;
- no ``base_model``: a starter already in the data root is the shipped one (its digest) or a
  complete local build, before it is reused;
- ``tracking_uri``: the store works, checked for its kind in seconds (the MLflow REST API itself
  for a server, the file and directory for SQLite, the driver and a connection for a database,
  the plugin for a SageMaker ARN); MLflow's own client would retry for minutes;
- ``training.resume='required'``: the run already has a checkpoint to continue.

``mazerl run`` calls the same checks before it starts Prefect or the Ray head, and adds
:func:`~mazerl.preflight.ray_address.check_ray_address` for a cluster address.

Every error is an :class:`~mazerl.preflight.input_error.InputError` naming the parameter, the value and
the fix; retrying cannot help, so the task does not retry it.

Where each check lives: :mod:`~mazerl.preflight.data_root`, :mod:`~mazerl.preflight.model_dir` (the base
model, the starter copy), :mod:`~mazerl.preflight.tracking_store`, :mod:`~mazerl.preflight.ray_address`,
:mod:`~mazerl.preflight.pipeline` (the eval set, ``training.resume``, and all of them for one run);
:mod:`~mazerl.preflight.http_answer` asks an address for an answer within seconds. This package's
``__init__`` imports nothing: callers import each check from its module.
"""
