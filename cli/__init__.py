"""The command line: ``mazerl`` (``main``), ``mazerl run`` (``run``), and the check of ``prefect.yaml``'s
schedules (``python -m cli.schedules``).

These are the orchestration layer's front ends, not flows: they start Prefect (``run``) or read
its deployment file (``schedules``), so they live outside the plain-Python library ``mazerl/``.
The library's own subcommands (``mazerl eval``, ``build-starter``, ``ui``, ``ray``) stay with the
code they drive; ``main`` only puts them together. Nothing imports this package.
"""
