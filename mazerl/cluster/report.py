"""Readiness rows: (name, expected, found, ok), the shape every cluster check reports in.

The rows go unchanged into a Prefect table artifact and an MLflow table, so they are plain
strings and a bool; :meth:`ClusterReport.records` gives the list of dicts both accept.
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


@dataclass(frozen=True)
class ClusterReport:
    """All rows of one verification; ``ok`` only when every row is."""

    address: str
    rows: tuple[CheckRow, ...] = field(default_factory=tuple)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return bool(self.rows) and all(row.ok for row in self.rows)

    @property
    def failures(self) -> tuple[CheckRow, ...]:
        return tuple(row for row in self.rows if not row.ok)

    def records(self) -> list[dict[str, object]]:
        """``[{"name", "expected", "found", "ok"}, ...]`` for ``create_table_artifact`` and ``mlflow.log_table``."""
        return [asdict(row) for row in self.rows]

    def markdown(self) -> str:
        lines = ["| check | expected | found | ok |", "| --- | --- | --- | --- |"]
        for row in self.rows:
            cells = (row.name, row.expected, row.found, "yes" if row.ok else "**NO**")
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
