"""MLflow only (no Ray, no Prefect).

``store`` (tracking URI, experiment, UI addresses), ``lineage`` (the run tree: the parent run, one
child per stage, run states), ``params``, ``artifacts`` (scrubbed of secrets: ``secrets``), ``evals``
(eval sets and eval reports), ``mlflow_model`` (the merged model as an MLflow model), ``metrics``
(each step's metrics exactly once), ``curves``, ``registry`` (promotion).
"""
