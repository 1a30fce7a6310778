"""The eval stage: greedy play of a fixed eval set over Ray workers, results and summary files, GIFs.

Import what you need from its modules (``mazerl.evaluation.evaluate`` holds ``evaluate`` and
``EvalReport``); the package itself imports nothing, so that ``mazerl eval`` can check its flags and
refuse a bad one before torch is imported (seconds on a laptop).
"""
