"""mazerl: library code for the maze GRPO pipeline (no Prefect imports here).

Sub-packages run inside Ray jobs as well as in the orchestrator: ``policy``, ``starter``,
``evaluation``, ``training``, ``merge``, ``cluster``, ``tracking``, ``reporting`` and ``preflight``
(each ``__init__`` says what its modules own). The modules beside them are small helpers every
package may use: ``paths`` (the data root and run layout), ``atomic`` (write to a temporary name,
then rename), ``process_lock`` (a lock a process holds for its lifetime, naming its holder),
``progress`` (progress lines and the ``step N/M:`` line's format), ``run_clock`` (the ``stage k/7``
lines and the time left), ``fingerprint`` (model digests), ``input_files`` (a user's JSON/YAML read
safely), ``address_forms`` (the form of a tracking URI, a Ray address, an ARN), ``eval_files`` (the
eval stage's files and metric names), ``upstream_warnings``; and the pipeline's inputs, ``params``.
docs/architecture.md has the table and the import rules.
"""

from mazerl import upstream_warnings

upstream_warnings.install()
