"""What a user changes when a readiness check fails: the pipeline parameter behind each requirement.

:meth:`mazerl.cluster.checks.report.ClusterReport.raise_for_failures` puts the fix of every failed
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
    "gpu.compute_capability": "the image's torch has no kernels for these GPUs: rebuild deployments/docker/Dockerfile "
    "on a CUDA/torch build whose arch list has the GPU's sm_XX (Blackwell sm_120 needs CUDA >= 12.8; TORCH_VERSION, "
    "BASE_IMAGE), or run on GPU nodes of an architecture the row lists",
    "gpu.flash_attn": "install a flash-attn wheel built for the GPU's architecture (GPU_WHEELS_INDEX in "
    "deployments/docker/Dockerfile, or build it with FLASH_ATTN_CUDA_ARCHS including it and "
    "FLASH_ATTENTION_SKIP_CUDA_BUILD=FALSE)",
    "gpu.vllm_generate": "make vLLM run on these GPUs with this model: a vllm wheel with kernels for the GPU's "
    "architecture (VLLM_VERSION in deployments/docker/Dockerfile, with the skyrl release that pins it), base_model "
    "a directory vLLM loads; eval_engine hf avoids vLLM for the evals only",
    "gpu.lora_adapter": "use a LoRA vLLM serves on this model: training.lora.rank one of vLLM's ranks and "
    "training.lora.target_modules the language model's projections (q_proj ... down_proj), or a vllm release "
    "with LoRA for this architecture",
}
