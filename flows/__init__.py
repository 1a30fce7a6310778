"""Prefect flows: composition only (the stages in order, one screen each)."""
