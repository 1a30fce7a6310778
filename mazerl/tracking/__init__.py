"""MLflow only: the store, the run tree, params, scrubbed artifacts, eval and model logging, metrics, promotion."""
