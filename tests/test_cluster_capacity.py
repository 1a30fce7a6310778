"""The wait for resources before a retry (mazerl.cluster.jobs.capacity): its pace, its bound, its messages.

The wait itself runs on the cluster as a Ray job. Its loop runs here on a stand-in clock and a
stand-in placement group, so minutes of waiting take no time; the real job runs on the session's
head (no GPU: it gives up) and, with a node lost and replaced, on the multi-node rehearsal cluster
(tests/test_cluster_rehearsal.py).
"""

from __future__ import annotations

import time

import pytest

from mazerl.cluster.errors import ConfigError
from mazerl.cluster.jobs.capacity import ResourceNeed, shortfall, wait_until_placed

SKYRL_HYPERPOD = ResourceNeed(tuple({"GPU": 1.0, "CPU": 1.0} for _ in range(6)), "PACK", what="the train job")


class FakeCluster:
    """A clock, and a placement group that places once ``replaced_at`` seconds have passed."""

    def __init__(self, replaced_at: float | None):
        self.now = 0.0
        self.replaced_at = replaced_at

    def clock(self) -> float:
        return self.now

    def placed(self, wait_s: float) -> bool:
        if self.replaced_at is not None and self.now + wait_s >= self.replaced_at:
            self.now = max(self.now, self.replaced_at)
            return True
        self.now += wait_s
        return False

    def free(self) -> dict[str, float]:
        return {"GPU": 6.0 if self.replaced_at is not None and self.now >= self.replaced_at else 4.0, "CPU": 100.0}


def wait(cluster: FakeCluster, timeout_s: float, report_every_s: float = 60.0):
    said: list[tuple[float, str]] = []
    result = wait_until_placed(
        SKYRL_HYPERPOD,
        timeout_s=timeout_s,
        report_every_s=report_every_s,
        placed=cluster.placed,
        free=cluster.free,
        nodes=lambda: "2 ALIVE GPU nodes, 1 DEAD node",
        say=lambda line: said.append((cluster.now, line)),
        clock=cluster.clock,
    )
    return result, said


def test_a_lost_node_is_waited_for_with_a_line_a_minute_until_its_replacement_places_the_group():
    # given SkyRL's placement group and a node that HyperPod replaces after 10 minutes,
    result, said = wait(FakeCluster(replaced_at=600.0), timeout_s=2700.0)
    # then the wait says what it waits for at once and then once a minute, with the time it has left,
    waiting = [(t, line) for t, line in said if line.startswith("waiting")]
    assert [t for t, _ in waiting] == [2.0 + 60.0 * k for k in range(10)], "a steady pace, the first at once"
    assert waiting[0][1] == (
        "waiting for 6 GPUs: 4 free (2 ALIVE GPU nodes, 1 DEAD node; 44 min left) for the train job"
    )
    # and it ends as soon as the group places.
    assert result.ready and result.waited_s == 600.0
    assert said[-1][1] == "resources ready after 10 min: 6 GPUs, 6 CPUs for the train job"


def test_a_cluster_that_has_the_resources_is_not_waited_for():
    result, said = wait(FakeCluster(replaced_at=0.0), timeout_s=2700.0)
    assert result.ready and result.waited_s == 0.0
    assert [line for _, line in said] == ["resources ready: 6 GPUs, 6 CPUs for the train job"]


def test_the_wait_gives_up_at_its_bound_naming_what_is_missing():
    result, said = wait(FakeCluster(replaced_at=None), timeout_s=300.0)
    assert not result.ready and result.waited_s == 300.0
    assert result.message == (
        "gave up after 5 min waiting for 6 GPUs: 4 free (2 ALIVE GPU nodes, 1 DEAD node) for the train job "
        "(6 GPUs, 6 CPUs in all, 6 bundles, PACK)"
    )
    assert len([line for _, line in said if line.startswith("waiting")]) == 5


def test_a_shortfall_names_the_first_missing_resource_and_else_the_bundles_shape():
    assert shortfall(SKYRL_HYPERPOD, {"GPU": 4.0, "CPU": 2.0}) == "6 GPUs: 4 free"
    assert shortfall(SKYRL_HYPERPOD, {"GPU": 6.0, "CPU": 2.0}) == "6 CPUs: 2 free"
    assert "no set of nodes holds them together" in shortfall(SKYRL_HYPERPOD, {"GPU": 8.0, "CPU": 64.0})


@pytest.mark.parametrize(
    ("bundles", "strategy"),
    [(({"GPU": -1.0},), "PACK"), (({},), "PACK"), (({"GPU": 1.0},), "TIGHT")],
)
def test_a_nonsense_need_is_refused(bundles, strategy):
    with pytest.raises(ConfigError):
        ResourceNeed(bundles, strategy)


def test_the_train_job_needs_skyrls_placement_group_or_the_local_jobs_gpu(tmp_path):
    from mazerl.training.config import TrainConfig
    from tasks.training import job_need

    skyrl = TrainConfig(run_id="r", base_model=tmp_path, backend="skyrl", skyrl={"num_gpus": 2, "num_nodes": 3})
    assert job_need(skyrl, 0).bundles == SKYRL_HYPERPOD.bundles and job_need(skyrl, 0).strategy == "PACK"
    local = TrainConfig(run_id="r", base_model=tmp_path)
    assert job_need(local, 1).bundles == ({"GPU": 1.0},)
    assert job_need(local, 0).bundles == (), "a CPU training waits for nothing"


@pytest.mark.image_stack  # the wait is a Ray job: Ray's job client, on the Ray the image ships too
def test_the_wait_job_on_a_real_head_gives_up_naming_the_missing_gpu_and_passes_what_it_has(local_ray_head):
    from mazerl.cluster.errors import ResourcesUnavailableError
    from mazerl.cluster.jobs.capacity import wait_for_resources

    lines: list[str] = []
    common = {"pipeline_run_id": f"cap{time.time_ns()}", "attempt": 2, "headers": local_ray_head.auth_headers()}
    # given the session's head (2 CPUs, no GPU), when a retry waits 4 s for a GPU, then it says so and gives up;
    with pytest.raises(ResourcesUnavailableError, match=r"gave up after \d+ s waiting for 1 GPU: 0 free") as refused:
        wait_for_resources(
            local_ray_head.address,
            ResourceNeed(({"GPU": 1.0},), what="the train job"),
            stage="train",
            timeout_s=4.0,
            report_every_s=1.0,
            log=lines.append,
            **common,
        )
    assert refused.value.waited_s >= 4.0
    assert any(line.startswith("waiting for 1 GPU: 0 free (0 ALIVE GPU nodes;") for line in lines), lines
    # and a need the head can place is ready at once.
    lines.clear()
    waited = wait_for_resources(
        local_ray_head.address, ResourceNeed(({"CPU": 1.0},)), stage="eval", timeout_s=60.0, log=lines.append, **common
    )
    assert waited < 5.0 and "resources ready: 1 CPU for the job" in lines, lines
