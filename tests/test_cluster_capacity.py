"""The wait for resources before a retry (mazerl.cluster.capacity): its pace, its bound, its messages.

The wait itself runs on the cluster as a Ray job; here its loop runs on a stand-in clock and a
stand-in placement group, so minutes of waiting take no time. The rehearsal
(tests/test_cluster_rehearsal.py) runs the real job on a multi-node Ray cluster with a node lost.
"""

from __future__ import annotations

import pytest

from mazerl.cluster.capacity import ResourceNeed, shortfall, wait_until_placed
from mazerl.cluster.errors import ConfigError

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
