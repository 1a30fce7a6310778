"""Loopback addresses and free loopback ports: the embedded Ray head listens on 127.0.0.1 only.

:func:`is_loopback_host` is the one home of "is this address on this machine" (the embedded head
checks its node IP, the job runtime env and the preflight whether a cluster shares this
machine's files); :func:`free_ports` picks the head's ports.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket

LOOPBACK = "127.0.0.1"


def is_loopback_ip(address: str | None) -> bool:
    """True for an IP address of 127.0.0.0/8 (or ::1); False for anything else, names included."""
    try:
        return ipaddress.ip_address(address or "").is_loopback
    except ValueError:
        return False


def is_loopback_host(host: str | None) -> bool:
    """True for a host on this machine: ``localhost`` or a loopback IP address (:func:`is_loopback_ip`).

    The one home of "is this address local": the embedded head checks its node IP with it, the
    submitter whether a job's cluster shares this machine's files.
    """
    return host == "localhost" or is_loopback_ip(host)


def port_free(port: int) -> bool:
    """Whether a server can bind ``port`` on the loopback address now.

    Probed with ``SO_REUSEADDR``, as the servers that take it bind (the Ray dashboard's aiohttp):
    a port whose last connections still sit in TIME_WAIT after its server was killed is free
    for them, so a head started again at once keeps its usual port instead of moving."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports. The probe sockets stay bound until all are
    picked: closing each before asking for the next let the kernel hand out the same port twice,
    and Ray refuses to start when two of its components share one."""
    with contextlib.ExitStack() as stack:
        probes = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)]
        for probe in probes:
            probe.bind((LOOPBACK, 0))
        return [probe.getsockname()[1] for probe in probes]
