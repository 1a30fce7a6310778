"""The command line: ``mazerl`` (``main``), its commands, and the check of ``prefect.yaml``'s schedules.

``run`` (``mazerl run``, with ``resume`` and ``prefect_server``), ``eval`` (``mazerl eval``),
``build_starter`` (``mazerl build-starter``), ``ui`` (``mazerl ui``) and ``ray`` (``mazerl ray``);
``schedules`` is ``python -m cli.schedules``. These are front ends, not flows: they check flags
(with ``mazerl.preflight``), then call the library or start Prefect, so they sit above every
package of the plain-Python library ``mazerl/``. ``main`` only puts them together. Nothing of the
library, ``tasks/`` or ``flows/`` imports this package.
"""
