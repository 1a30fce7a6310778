"""The pipeline's outcomes in MLflow: eval reports recorded into their stage runs, and the run's conclusion.

Above ``tracking`` (pure MLflow), ``evaluation`` and ``training``: it joins an eval report or
a training config with the run tree, so it may import all three, and only ``tasks`` imports it.
"""
