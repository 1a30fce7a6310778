"""This process as a Ray *driver* of the embedded head (``ray.init`` with its address and token).

A process that only submits jobs uses ``JobSubmissionClient(head.address,
headers=head.auth_headers())``; one that runs Ray tasks itself (``evaluate()`` without a
cluster, the benchmarks) connects as a driver with :func:`ray_driver`, never with a bare
``ray.init()``, which would start a Ray of its own listening on every interface.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from mazerl.cluster.head.local import LocalRayHead


@contextlib.contextmanager
def ray_driver(head: LocalRayHead) -> Iterator[None]:
    """This process as a Ray driver of ``head`` for the block (``ray.init`` with its token), then disconnected.

    The head's client settings (address, token file, loopback-only mode) are in this process's
    environment only for the block, so other clients of this process are not changed.
    """
    import ray
    from ray._private import ray_constants

    saved = {name: os.environ.get(name) for name in head.client_env()}
    clusters_enabled = ray_constants.ENABLE_RAY_CLUSTER
    # Ray reads these settings when it is imported; a process that imported it before (a test
    # session, a notebook) is brought up to date the way Ray itself does it when it turns token
    # auth on: refresh its config and its token cache. Without the local-only switch Ray swaps
    # 127.0.0.1 for the machine's external address.
    os.environ.update(head.client_env())
    ray_constants.ENABLE_RAY_CLUSTER = False
    _refresh_ray_auth()
    try:
        ray.init(address=head.gcs_address, log_to_driver=False)
        try:
            yield
        finally:
            ray.shutdown()
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = clusters_enabled
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        _refresh_ray_auth()


def _refresh_ray_auth() -> None:
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()
