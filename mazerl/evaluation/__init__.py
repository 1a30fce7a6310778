"""The eval stage: greedy play of a fixed eval set over Ray workers, results and summary files, GIFs.

Import what you need from its modules (``mazerl.evaluation.evaluate`` holds ``evaluate`` and
``EvalReport``); the package itself imports nothing, so that ``mazerl eval`` can check its flags and
refuse a bad one before torch is imported (seconds on a laptop).

``evaluate`` (``evaluate(model, EvalSettings, out) -> EvalReport`` over Ray workers), ``settings`` (the
one eval request type, named as the parameters are), ``engines`` (the engines and a worker's GPUs),
``summary`` (Wilson interval, exact McNemar p), ``failures`` (failure kinds, first mistakes),
``placement`` (the workers' resources reserved first, a bounded wait naming what holds them), ``workers``
(the Ray actors that play the mazes),
``on_cluster`` (the eval as a Ray job elsewhere) and ``job_entry`` (``python -m mazerl.evaluation.job_entry``).
"""
