"""A SkyRL-shaped training job for the cluster rehearsal (no GPU, no SkyRL): SkyRL's placement, our local engine.

``python -m tests.rehearsal_skyrl_entry --config FILE`` with a ``backend: skyrl`` TrainConfig, in the
place of ``mazerl.training.skyrl_entry`` (tests/test_cluster_rehearsal.py swaps the train stage's
entrypoint). What it keeps of SkyRL 0.4's job, because that is what a lost GPU node meets:

1. the driver runs where Ray starts a job that asks for no resources: the head;
2. it reserves SkyRL's placement group, every training GPU at once
   (``mazerl.training.skyrl_backend.placement_bundles``: 6 x {GPU: 1, CPU: 1}, PACK for the
   hyperpod shape), and gives up when it is not placed within :data:`PLACEMENT_TIMEOUT_S`
   (exit 1, as SkyRL's ``get_ray_pg_ready_with_timeout`` raises);
3. training runs inside the group, in its first bundle, and a lost node fails the job instead of
   being retried by Ray (SkyRL's workers are actors that die with their node).

What stands in: the training is our local GRPO engine (``mazerl.training.local_entry``, the same
config as ``backend: local``), on CPU, in one bundle; SkyRL would run FSDP workers and vLLM engines
in all of them. Checkpoints, the ``step N/M:`` lines and the metrics are the local engine's, in the
layout both backends share (docs/architecture.md, "The data root").
"""

from __future__ import annotations

import argparse
import sys

PLACEMENT_TIMEOUT_S = 60.0
STEP_PAUSE_S = 1.5  # a step lasts at least this long, as a GPU step would: a node can be lost mid-run
TRAINING_ON = "[rehearsal_skyrl_entry] training on node "
EXIT_FAILURE = 1


def train_in_bundle(config_path: str) -> int:
    """The local engine's entry, inside the placement group's first bundle."""
    import time

    import ray

    from mazerl.training import local_entry, local_trainer
    from mazerl.training.local_trainer import LocalGRPOTrainer

    print(f"{TRAINING_ON}{ray.get_runtime_context().get_node_id()}", flush=True)  # the rehearsal kills that node
    # The miniature's steps take a fraction of a second on a fast CPU: all four could end between
    # two polls of the test that waits for step 2 to kill the node. Each step's rollout waits first.
    rollout = LocalGRPOTrainer._rollout

    def paced_rollout(self, step):
        time.sleep(STEP_PAUSE_S)
        return rollout(self, step)

    LocalGRPOTrainer._rollout = paced_rollout
    # SkyRL's entry never rewrites the stage's train_config.json (backend: skyrl); the local engine standing
    # in for it trains from a backend-local copy and would record that copy there, which a retry then
    # refuses as an edited config. Keep the stage's file as SkyRL leaves it.
    local_trainer.record_config = lambda config: config.run_dir / "train_config.json"

    return local_entry.main(["--config", config_path])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True)
    args = parser.parse_args(argv)

    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from mazerl.training.config import load_config, save_config
    from mazerl.training.skyrl_backend import placement_bundles

    config = load_config(args.config)
    bundles, strategy = placement_bundles(config)
    local = save_config(config.model_copy(update={"backend": "local"}), config.run_dir / "rehearsal_local_config.json")

    ray.init(address="auto", log_to_driver=True)
    print(f"[rehearsal_skyrl_entry] driver on node {ray.get_runtime_context().get_node_id()}", flush=True)
    group = placement_group(bundles, strategy=strategy)
    ready, _ = ray.wait([group.ready()], timeout=PLACEMENT_TIMEOUT_S)
    if not ready:
        print(
            f"[rehearsal_skyrl_entry] placement group of {len(bundles)} x {bundles[0]} ({strategy}) not ready "
            f"within {PLACEMENT_TIMEOUT_S:.0f} s",
            flush=True,
        )
        return EXIT_FAILURE
    print(f"[rehearsal_skyrl_entry] placement group of {len(bundles)} bundles ready", flush=True)
    try:
        task = ray.remote(train_in_bundle).options(
            num_cpus=bundles[0].get("CPU", 0),
            num_gpus=bundles[0].get("GPU", 0),
            max_retries=0,  # SkyRL's workers die with their node: the job fails, the stage retries
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0),
        )
        return int(ray.get(task.remote(str(local))))
    except Exception as exc:  # noqa: BLE001 - a lost node (WorkerCrashedError, NodeDiedError) is an infra failure
        print(f"[rehearsal_skyrl_entry] training failed: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
        return EXIT_FAILURE
    finally:
        remove_placement_group(group)


if __name__ == "__main__":
    sys.exit(main())
