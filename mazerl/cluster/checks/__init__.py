"""``verify_cluster``: is the cluster ready for this run? Seconds of checks, each a row with its fix.

- :mod:`~mazerl.cluster.checks.verify`: the rows, in order; :mod:`~mazerl.cluster.checks.report`: rows and report;
- :mod:`~mazerl.cluster.checks.run_requirements`: the placement and disk a training run needs;
- :mod:`~mazerl.cluster.checks.probe`: what runs inside the cluster (storage, versions, files);
- :mod:`~mazerl.cluster.checks.gpu_smoke`: the GPU stack on each GPU worker;
- :mod:`~mazerl.cluster.checks.hyperpod`: SageMaker HyperPod cluster and node health;
- :mod:`~mazerl.cluster.checks.fixes`: ``CLUSTER_FIXES``, the fix for each failed check.
"""
