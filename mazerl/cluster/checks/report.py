"""Readiness rows: (name, expected, found, ok, advisory), the shape every cluster check reports in.

The rows go unchanged into a Prefect table artifact and an MLflow table, so they are plain
strings and bools; :meth:`ClusterReport.records` gives the list of dicts both accept.

An *advisory* row reports a check that could not be made for a reason that does not endanger
the run (an optional permission the flow pod lacks, say): it is shown, and logged as a
warning, but never makes the cluster "not ready".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class CheckRow:
    name: str  # dotted, e.g. "ray.gpus", "storage.shared", "hyperpod.nodes"
    expected: str
    found: str
    ok: bool
    advisory: bool = False  # a failed advisory row is a warning, not a reason to stop


@dataclass(frozen=True)
class ClusterReport:
    """All rows of one verification; ``ok`` only when every row is."""

    address: str
    rows: tuple[CheckRow, ...] = field(default_factory=tuple)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return bool(self.rows) and not self.failures

    @property
    def failures(self) -> tuple[CheckRow, ...]:
        return tuple(row for row in self.rows if not row.ok and not row.advisory)

    @property
    def warnings(self) -> tuple[CheckRow, ...]:
        """Advisory rows that did not pass: shown and logged, never blocking."""
        return tuple(row for row in self.rows if not row.ok and row.advisory)

    def records(self) -> list[dict[str, object]]:
        """``[{"name", "expected", "found", "ok", "advisory"}, ...]`` for ``create_table_artifact`` and ``mlflow.log_table``."""
        return [asdict(row) for row in self.rows]

    def markdown(self) -> str:
        lines = ["| check | expected | found | ok |", "| --- | --- | --- | --- |"]
        for row in self.rows:
            verdict = "yes" if row.ok else ("advisory: no" if row.advisory else "**NO**")
            cells = (row.name, row.expected, row.found, verdict)
            lines.append("| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
        verdict = "ready" if self.ok else f"NOT ready ({len(self.failures)} failed)"
        return "\n".join([*lines, "", f"Cluster {self.address}: {verdict} in {self.seconds:.1f} s."])

    def raise_for_failures(self, fixes: Mapping[str, str] | None = None) -> None:
        """Raise :class:`ClusterNotReadyError` listing every failed row (and, from ``fixes``, what to change)."""
        if not self.ok:
            raise ClusterNotReadyError(self, fixes)


class ClusterNotReadyError(RuntimeError):
    """The cluster cannot run the training config; the message lists what is missing.

    ``fixes`` maps check names to what the caller's user can change (the orchestrator knows
    which of its parameters decides a requirement; this module does not).
    """

    def __init__(self, report: ClusterReport, fixes: Mapping[str, str] | None = None):
        failed = "; ".join(f"{r.name}: expected {r.expected}, found {r.found}" for r in report.failures)
        todo = [f"{r.name}: {fixes[r.name]}" for r in report.failures if fixes and r.name in fixes]
        super().__init__(
            f"cluster {report.address} is not ready: {failed or 'no checks ran'}"
            + (f". To fix: {'; '.join(todo)}" if todo else "")
        )
        self.report = report
