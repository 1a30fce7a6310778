"""A stage as a Ray job: the one submission path for both training backends, the evals and the merge.

- :mod:`~mazerl.cluster.jobs.submitter`: ``RayJob``, submitted or re-attached, followed to its end;
- :mod:`~mazerl.cluster.jobs.spec`: submission ids, metadata, entrypoints, runtime environments;
- :mod:`~mazerl.cluster.jobs.pipeline_jobs`: a pipeline run's jobs among the cluster's, and stopping them;
- :mod:`~mazerl.cluster.jobs.log`: following a job's log, and where a retry continues it;
- :mod:`~mazerl.cluster.jobs.hang_watchdog`: the watchdog and the progress probe it reads;
- :mod:`~mazerl.cluster.jobs.outcome`: how a job ended, and whether a retry can help;
- :mod:`~mazerl.cluster.jobs.capacity`: a retry's wait until the cluster can place the job.
"""
