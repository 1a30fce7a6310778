"""A Ray address: a given dashboard answers, a flag has the form ``ray_address`` has, and ``RAY_ADDRESS``
in the environment (which Ray's clients read when given no address) is one Ray can parse.
"""

from __future__ import annotations

import os
from urllib.parse import urlparse

from mazerl.address_forms import check_ray_address_form, control_character, redacted
from mazerl.preflight.http_answer import no_answer
from mazerl.preflight.input_error import InputError


def check_ray_address(address: str) -> None:
    """A Ray dashboard (job server) answers at ``address`` (http/https; ``sagemaker_ray://`` is left to Ray)."""
    if urlparse(address).scheme not in ("http", "https"):
        return
    problem = no_answer(address.rstrip("/") + "/api/version", ray=True)
    if problem:
        raise InputError(
            "ray_address",
            f"ray_address={redacted(address)!r}: the address {problem}; check that the head is running and that the "
            "address is its dashboard (http://<head>:8265), or leave ray_address (--ray-address) empty to start a "
            "local head",
        )


def check_ray_address_form_as(value: str, field: str) -> str:
    """``value`` checked for the form ``ray_address`` has, the error naming ``field`` (a flag)."""
    try:
        return check_ray_address_form(value) or value
    except ValueError as exc:
        raise InputError(field, str(exc).replace("ray_address", field, 1)) from None


RAY_ADDRESS_SCHEMES = ("ray", "http", "https", "sagemaker_ray")  # the address forms Ray's clients parse


def check_ray_address_env() -> str | None:
    """``RAY_ADDRESS`` from the environment, which Ray's clients read when given no address (``mazerl eval``
    connects to it), refused where Ray could not parse it; None when it is not set.

    Ray takes ``auto``, ``local``, a GCS ``host:port``, or an address with one of its schemes; a value
    such as ``garbage`` would otherwise end in Ray's own "Module: garbage does not exist".
    """
    value = os.environ.get("RAY_ADDRESS")
    if value is None or value in ("auto", "local"):
        return value
    fix = (
        "RAY_ADDRESS is set in the environment, where Ray reads it: give a Ray address (auto, <head>:6379, "
        "ray://<head>:10001) or unset it (unset RAY_ADDRESS)"
    )
    char = control_character(value)
    if char:
        raise InputError("RAY_ADDRESS", f"RAY_ADDRESS holds a control character ({char}); {fix}")
    if "://" in value:
        scheme = value.split("://", 1)[0]
        if scheme not in RAY_ADDRESS_SCHEMES:
            raise InputError(
                "RAY_ADDRESS",
                f"RAY_ADDRESS={redacted(value)!r} has the scheme {scheme!r}, which Ray does not know; {fix}",
            )
        try:
            parsed = urlparse(value)
            parsed.port  # noqa: B018 (raises for a port out of range)
        except ValueError as exc:
            raise InputError("RAY_ADDRESS", f"RAY_ADDRESS={redacted(value)!r} does not parse ({exc}); {fix}") from None
        if parsed.username is not None or parsed.password is not None:
            raise InputError(
                "RAY_ADDRESS", f"RAY_ADDRESS={redacted(value)!r} carries credentials (user:password@); {fix}"
            )
        return value
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError("RAY_ADDRESS", f"RAY_ADDRESS={value!r} is not a Ray address (host:port); {fix}")
    return value
