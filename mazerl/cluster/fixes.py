"""What a user changes when a readiness check fails: the pipeline parameter behind each requirement.

:meth:`mazerl.cluster.report.ClusterReport.raise_for_failures` puts the fix of every failed
check into its error, so a failed ``verify_cluster`` says which parameter to change.
"""

CLUSTER_FIXES = {
    "ray.address": "set ray_address to the head's dashboard (http://<head>:8265), or leave it empty to start a "
    "local head, and check that the head is running",
    "ray.probe_job": "make mazerl importable on the cluster (the image, or PYTHONPATH) and check the job's log",
    "ray.version": "use the same Ray major version (>= 2.52) on the cluster as here",
    "ray.nodes": "start the missing nodes, or lower training.skyrl.num_nodes",
    "ray.dead_nodes": "replace the DEAD nodes, or lower training.skyrl.num_nodes",
    "ray.gpus": "add GPU nodes, or lower training.skyrl.num_gpus / num_nodes or local_train_gpus (the training "
    "placement)",
    "ray.gpu_placement": "add nodes with enough GPUs, or lower training.skyrl.num_gpus (GPUs per node)",
    "ray.eval_placement": "lower eval_workers or eval_gpus_per_worker, or add GPU nodes (eval_engine hf needs no GPU)",
    "ray.merge_memory": "give a node (the head) more memory in the RayCluster spec, or merge a smaller model",
    "storage.shared": "set data_root to a mount every node shares (/shared on HyperPod)",
    "storage.free_space": "free space under data_root, or choose another data_root",
    "inputs.base_model": "set base_model to a complete model directory as the cluster's nodes see it",
    "inputs.eval_set": "restore the eval set file (git checkout envs/data) or choose another eval_set",
    "hyperpod.cluster": "set hyperpod_cluster to an existing cluster of this account and AWS_REGION",
    "hyperpod.nodes": "wait for HyperPod to replace the failed nodes, or retry later",
}
