"""Wait, with a bound, until the cluster has the resources a job asks for, before a retry submits it.

Why: SkyRL reserves every training GPU in one placement group (``6 x {GPU: 1, CPU: 1}``, PACK for
the ``hyperpod`` config) and gives up on it after 180 s. When a GPU node is lost, HyperPod needs
many minutes to replace it (a new instance, its image pulled, its Ray worker joined), so retries
that resubmit at once all fail at the placement group and end the flow run before the node is
back. The train stage therefore runs this wait before each resubmission
(:class:`~mazerl.cluster.jobs.submitter.RayJob`'s ``before_submit``).

How: the wait is itself a short Ray job, ``python -m mazerl.cluster.jobs.capacity '<json request>'``,
so it works on every address the submitter accepts (the embedded head, a port-forwarded KubeRay
head, ``sagemaker_ray://``), with the same token and with its log in the caller's log. On the
cluster it asks Ray for the very placement group the job will ask for, which is the exact test
(per-node packing included; an autoscaler sees a pending group as demand), and waits for it:

- placed at once: it is released and the job is submitted, no line printed but ``resources ready``;
- not placed: ``waiting for 6 GPUs: 4 free (2 ALIVE GPU nodes, 1 DEAD node; 44 min left)`` at
  once and then every ``report_every_s``, until it is placed (released, ``resources ready after
  3 min 5 s``) or ``timeout_s`` passes: then it gives up, naming what is missing, and the caller
  raises :class:`~mazerl.cluster.errors.ResourcesUnavailableError` (not retried: the next attempt
  would meet the same cluster).

The job asks for no resources itself (its driver runs on the head) and prints one last line
``MAZERL_CAPACITY_RESULT {json}`` that the caller reads.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from mazerl.cluster.errors import ConfigError, ResourcesUnavailableError
from mazerl.cluster.jobs.spec import JobSpec
from mazerl.cluster.jobs.submitter import RayJob

RESULT_PREFIX = "MAZERL_CAPACITY_RESULT "
FIRST_LOOK_S = 2.0  # a group that places within this is "ready" without a waiting line
REPORT_EVERY_S = 60.0
STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


@dataclass(frozen=True)
class ResourceNeed:
    """What a job asks Ray for: the bundles of one placement group (SkyRL's, or the entrypoint's own)."""

    bundles: tuple[dict[str, float], ...]
    strategy: str = "PACK"
    what: str = "the job"  # who asks, for the messages ("the train job")

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"strategy ({self.strategy!r}) must be one of {STRATEGIES}")
        for bundle in self.bundles:
            if not bundle or any(not isinstance(v, int | float) or v < 0 for v in bundle.values()):
                raise ConfigError(f"bundle {bundle!r} must map resource names to amounts >= 0")

    def totals(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for bundle in self.bundles:
            for name, amount in bundle.items():
                out[name] = out.get(name, 0.0) + float(amount)
        return out

    def describe(self) -> str:
        """``6 GPUs, 6 CPUs`` (GPUs first)."""
        totals = self.totals()
        names = sorted(totals, key=lambda name: (name != "GPU", name != "CPU", name))
        return ", ".join(_amount(totals[name], name) for name in names if totals[name] > 0) or "nothing"


@dataclass(frozen=True)
class WaitResult:
    ready: bool
    waited_s: float
    message: str
    lines: tuple[str, ...] = field(default_factory=tuple)


def _amount(value: float, name: str) -> str:
    number = f"{value:g}"
    return f"{number} {name}{'' if value == 1 or name == 'memory' else 's'}"


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds} s"
    minutes, rest = divmod(seconds, 60)
    return f"{minutes} min {rest} s" if minutes < 10 and rest else f"{minutes} min"


def shortfall(need: ResourceNeed, free: Mapping[str, float]) -> str:
    """``6 GPUs: 4 free`` for the first resource the cluster lacks in total (GPUs first); where the
    totals would fit but the group still does not place, the bundles' shape is what is missing."""
    totals = need.totals()
    for name in sorted(totals, key=lambda n: (n != "GPU", n != "CPU", n)):
        if totals[name] > 0 and free.get(name, 0.0) + 1e-9 < totals[name]:
            return f"{_amount(totals[name], name)}: {free.get(name, 0.0):g} free"
    return (
        f"{len(need.bundles)} bundles of {need.bundles[0]} ({need.strategy}): the free resources add up but "
        "no set of nodes holds them together"
    )


def waiting_line(need: ResourceNeed, free: Mapping[str, float], nodes: str, left_s: float) -> str:
    return f"waiting for {shortfall(need, free)} ({nodes}; {_duration(left_s)} left) for {need.what}"


def wait_until_placed(
    need: ResourceNeed,
    *,
    timeout_s: float,
    report_every_s: float,
    placed: Callable[[float], bool],
    free: Callable[[], Mapping[str, float]],
    nodes: Callable[[], str],
    say: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
) -> WaitResult:
    """The wait itself, on whatever ``placed(wait_s)`` tests (True once the group is placed; it may
    block up to ``wait_s``): a waiting line at once and then every ``report_every_s``, until placed or
    ``timeout_s`` has passed."""
    started = clock()
    deadline = started + timeout_s
    lines: list[str] = []

    def tell(line: str) -> None:
        lines.append(line)
        say(line)

    if placed(min(FIRST_LOOK_S, timeout_s)):
        tell(f"resources ready: {need.describe()} for {need.what}")
        return WaitResult(True, clock() - started, lines[-1], tuple(lines))
    while True:
        now = clock()
        if now >= deadline:
            missing = shortfall(need, free())
            message = (
                f"gave up after {_duration(now - started)} waiting for {missing} ({nodes()}) for {need.what} "
                f"({need.describe()} in all, {len(need.bundles)} bundles, {need.strategy})"
            )
            tell(message)
            return WaitResult(False, now - started, message, tuple(lines))
        tell(waiting_line(need, free(), nodes(), deadline - now))
        if placed(min(report_every_s, max(deadline - clock(), 0.0))):
            waited = clock() - started
            message = f"resources ready after {_duration(waited)}: {need.describe()} for {need.what}"
            tell(message)
            return WaitResult(True, waited, message, tuple(lines))


# --- on the cluster --------------------------------------------------------------------------


def _cluster_wait(request: dict[str, Any]) -> WaitResult:
    # lazy: ray takes seconds to import, and only the job on the cluster needs it
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    need = ResourceNeed(tuple(request["bundles"]), request.get("strategy", "PACK"), request.get("what", "the job"))
    ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
    group = placement_group(list(need.bundles), strategy=need.strategy)

    def placed(wait_s: float) -> bool:
        ready, _ = ray.wait([group.ready()], timeout=wait_s)
        return bool(ready)

    def node_counts() -> str:
        listed = ray.nodes()
        gpu_nodes = [n for n in listed if n.get("Alive") and n.get("Resources", {}).get("GPU", 0) > 0]
        dead = [n for n in listed if not n.get("Alive")]
        text = f"{len(gpu_nodes)} ALIVE GPU node{'' if len(gpu_nodes) == 1 else 's'}"
        return text + (f", {len(dead)} DEAD node{'' if len(dead) == 1 else 's'}" if dead else "")

    try:
        return wait_until_placed(
            need,
            timeout_s=float(request["timeout_s"]),
            report_every_s=float(request.get("report_every_s", REPORT_EVERY_S)),
            placed=placed,
            free=ray.available_resources,
            nodes=node_counts,
            say=lambda line: print(line, flush=True),
        )
    finally:
        remove_placement_group(group)  # the job reserves its own; this one only proved it fits


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m mazerl.cluster.jobs.capacity '<json request>'", file=sys.stderr)
        return 2
    try:
        request = json.loads(args[0])
        result = _cluster_wait(request)
    except (ValueError, KeyError, TypeError) as exc:
        print(f"the capacity request is not usable: {exc}", file=sys.stderr)
        return 2
    print(RESULT_PREFIX + json.dumps({"ready": result.ready, "waited_s": result.waited_s, "message": result.message}))
    return 0


# --- from the orchestrator ---------------------------------------------------------------------


def wait_for_resources(
    address: str,
    need: ResourceNeed,
    *,
    pipeline_run_id: str,
    attempt: int,
    stage: str,
    timeout_s: float,
    report_every_s: float = REPORT_EVERY_S,
    headers: dict[str, str] | None = None,
    runtime_env: dict[str, Any] | None | Literal["auto"] = "auto",
    log: Callable[[str], None] | None = None,
) -> float:
    """Run the wait job on the cluster; return the seconds waited, or raise
    :class:`ResourcesUnavailableError` naming what is missing once ``timeout_s`` has passed."""
    if not need.bundles or timeout_s <= 0:
        return 0.0
    say = log or (lambda _line: None)
    request = {
        "bundles": list(need.bundles),
        "strategy": need.strategy,
        "what": need.what,
        "timeout_s": timeout_s,
        "report_every_s": report_every_s,
    }
    seen: list[str] = []

    def follow(line: str) -> None:
        seen.append(line)
        if not line.startswith(RESULT_PREFIX):
            say(line)

    entrypoint = f"python -m mazerl.cluster.jobs.capacity {shlex.quote(json.dumps(request))}"
    with RayJob(
        address,
        JobSpec(
            entrypoint,
            pipeline_run_id=pipeline_run_id,
            attempt=attempt,
            stage=f"{stage}-resources",
            runtime_env=runtime_env,
        ),
        headers=headers,
        log=follow,
        poll_s=1.0,
    ) as job:
        job.wait()
    result = _result(seen)
    if not result["ready"]:
        raise ResourcesUnavailableError(result["message"], address=address, waited_s=float(result["waited_s"]))
    return float(result["waited_s"])


def _result(lines: Sequence[str]) -> dict[str, Any]:
    for line in reversed(lines):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX) :])
    raise ResourcesUnavailableError(
        "the capacity job ended without its result line; see its log above", address="", waited_s=0.0
    )


if __name__ == "__main__":
    sys.exit(main())
