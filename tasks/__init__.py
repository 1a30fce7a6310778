"""Prefect tasks: one library call each; inputs and outputs are paths, ids and small frozen values."""
