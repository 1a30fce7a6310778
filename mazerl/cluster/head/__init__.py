"""The embedded local Ray head: started, reused and stopped by the project (127.0.0.1, token auth).

- :mod:`~mazerl.cluster.head.local`: ``LocalRayHead``, its start, reuse and stop;
- :mod:`~mazerl.cluster.head.temp_dir`: its private temp dir and the files in it;
- :mod:`~mazerl.cluster.head.env`: the environment its jobs inherit (an allow-list, token auth, loopback only);
- :mod:`~mazerl.cluster.head.leases`: which processes use it; :mod:`~mazerl.cluster.head.process`: its process group;
- :mod:`~mazerl.cluster.head.driver`: this process as its Ray driver;
- :mod:`~mazerl.cluster.head.loopback`: loopback addresses and free ports.
"""
