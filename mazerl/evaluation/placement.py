"""The eval workers' resources, reserved before any worker starts, and a bounded wait for them.

Eval workers are Ray actors asking for CPUs and, on a GPU cluster, a GPU each. Ray queues an
actor it cannot place and waits forever: a baseline eval started while another job holds the
cluster's GPUs (a training of another run, a forgotten eval) used to sit silently. So the
workers' bundles are reserved first as one placement group (``SPREAD``: one worker per node
where it can), with a bound on the wait; the policy loads only once they are placed, so the
bound never counts a slow model load. When the bound passes, the error names what the cluster
runs that could hold the resources, and what to do.
"""

from __future__ import annotations

from typing import Any

PLACEMENT_WAIT_S = 600.0  # the cluster's resources, not the model load: HyperPod replaces a node within this


class WorkersNotPlaced(ValueError):
    """The cluster did not offer the eval workers' resources within the wait (not retried: the same cluster waits the same)."""


def reserve_workers(workers: int, threads: int, gpus: float, wait_s: float = PLACEMENT_WAIT_S) -> Any:
    """A ready placement group of ``workers`` bundles (``threads`` CPUs and ``gpus`` GPUs each), or WorkersNotPlaced."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    bundle = {"CPU": float(threads), **({"GPU": float(gpus)} if gpus else {})}
    group = placement_group([dict(bundle) for _ in range(workers)], strategy="SPREAD")
    ready, _ = ray.wait([group.ready()], timeout=wait_s)
    if ready:
        return group
    remove_placement_group(group)
    holders = running_jobs()
    raise WorkersNotPlaced(
        f"the eval's {workers} workers ({bundle} each) were not placed within {wait_s:.0f} s: the cluster has not "
        f"that much free ({', '.join(holders) if holders else 'no other job runs: it is too small'}); "
        + (f"stop what holds it (ray job stop {holders[0].split()[0]}) or wait for it, " if holders else "")
        + "or lower eval_workers, then run again"
    )


def running_jobs() -> list[str]:
    """The Ray jobs running on the cluster besides this one, as ``<submission id> (RUNNING)``."""
    import ray

    try:
        from ray.util.state import list_jobs

        mine = ray.get_runtime_context().get_job_id()
        jobs = list_jobs(filters=[("status", "=", "RUNNING")], raise_on_missing_output=False)
    except Exception:  # noqa: BLE001 - the state API is a nicety here: the error stands without it
        return []
    return [f"{job.submission_id or job.job_id} (RUNNING)" for job in jobs if job.job_id != mine]
