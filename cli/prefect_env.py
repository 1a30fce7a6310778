"""Prefect's settings in the environment, checked before ``mazerl run`` starts the Ray head or Prefect.

Prefect reads its ``PREFECT_*`` variables only when it starts, seconds into a run and after the Ray
head is up, and then fails in its own words, or not at all: a ``PREFECT_HOME`` it cannot write hangs
the run, a logging level it does not know is a pydantic traceback, a malformed ``PREFECT_API_URL``
says only "Invalid IPv6 URL". Each is refused here instead, naming the variable and the fix, without
importing Prefect (seconds): its rules are few and stable, and each check says which one it copies.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlparse

from mazerl.address_forms import control_character, redacted
from mazerl.preflight.data_root import check_data_root, check_uri_safe
from mazerl.preflight.http_answer import fetch
from mazerl.preflight.input_error import InputError

# Prefect's logging levels (prefect.types.LogLevel: these names, upper-cased first) and the variables that take one.
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_LEVEL_VARS = ("PREFECT_LOGGING_LEVEL", "PREFECT_INTERNAL_LOGGING_LEVEL", "PREFECT_SERVER_LOGGING_LEVEL")
API_URL_FIX = (
    "start the server (prefect server start), correct PREFECT_API_URL (e.g. http://127.0.0.1:4200/api), or "
    "unset it (unset PREFECT_API_URL) to run Prefect embedded under the data root"
)


def check_prefect_env() -> None:
    """Every ``PREFECT_*`` setting ``mazerl run`` depends on: the logging levels, ``PREFECT_HOME``, and a
    Prefect server named by ``PREFECT_API_URL`` (it answers as one)."""
    for name in LOG_LEVEL_VARS:
        value = os.environ.get(name)
        if value is not None and value.upper() not in LOG_LEVELS:
            raise InputError(
                name,
                f"{name}={value!r} is not a logging level Prefect knows; give one of {', '.join(LOG_LEVELS)}, or "
                f"unset it (unset {name})",
            )
    check_prefect_home()
    check_prefect_api()


def check_prefect_home() -> None:
    """``PREFECT_HOME``, when set, is a directory this user can write (or create), and makes a sound database URI.

    Prefect keeps its database there (a URI built from the path, as the data root's are); one it cannot
    write hangs the run after the Ray head has started. Unset, ``mazerl run`` puts it under the data root.
    """
    value = os.environ.get("PREFECT_HOME")
    if value is None:
        return
    fix = "choose a directory you can write for PREFECT_HOME, or unset it (unset PREFECT_HOME) for <data root>/prefect"
    if not value.strip():
        raise InputError("PREFECT_HOME", f"PREFECT_HOME is set but empty ({value!r}); {fix}")
    home = Path(value).expanduser()
    check_uri_safe(home, "PREFECT_HOME", fix)
    check_data_root(home, "PREFECT_HOME", fix)


def check_prefect_api() -> None:
    """A Prefect server named by ``PREFECT_API_URL`` answers its health check, before the Ray head starts.

    Without the variable ``mazerl run`` runs Prefect embedded (nothing to check). Prefect's
    ``/health`` answers ``true``; anything else is not a Prefect API.
    """
    url = os.environ.get("PREFECT_API_URL", "").strip()
    if not url:
        return
    shown = redacted(url)
    try:
        parsed = urlparse(url)
        parsed.port  # noqa: B018 (raises for a port out of range)
    except ValueError as exc:  # a malformed IPv6 host, a port out of range
        raise InputError(
            "PREFECT_API_URL", f"PREFECT_API_URL={shown!r} is not a valid address ({exc}); {API_URL_FIX}"
        ) from None
    if parsed.scheme not in ("http", "https") or control_character(url):
        raise InputError("PREFECT_API_URL", f"PREFECT_API_URL={shown!r} is not an http(s) address; {API_URL_FIX}")
    key = os.environ.get("PREFECT_API_KEY")
    answer = fetch(f"{url.rstrip('/')}/health", headers={"Authorization": f"Bearer {key}"} if key else None)
    if isinstance(answer, str):
        raise InputError("PREFECT_API_URL", f"PREFECT_API_URL={shown!r}: the Prefect server {answer}; {API_URL_FIX}")
    if answer.status in (401, 403):
        raise InputError(
            "PREFECT_API_URL",
            f"PREFECT_API_URL={shown!r}: the Prefect server refused this client (HTTP {answer.status}); set "
            "PREFECT_API_KEY to a key of that workspace, or unset PREFECT_API_URL to run Prefect embedded",
        )
    if answer.status != 200 or answer.json() is not True:
        raise InputError(
            "PREFECT_API_URL",
            f"PREFECT_API_URL={shown!r}: the address answered, but not as a Prefect API (HTTP {answer.status} "
            f"{answer.content_type} for /health); {API_URL_FIX}",
        )
