"""MLflow lineage: resilient metric logging, the stage runs, LoRA merge and promotion."""
