"""An HTTP address asked for an answer within seconds: what kind of server answered, or why none did."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from urllib.parse import urlparse

ANSWER_TIMEOUT_S = 5.0  # a server on the network answers /health or /api/version in milliseconds
ANSWER_READ_BYTES = 64 * 1024  # enough of an answer to tell what kind of server sent it


@dataclass(frozen=True)
class Answer:
    """An HTTP answer, as much of it as tells what kind of server sent it."""

    status: int
    content_type: str
    body: bytes

    def json(self) -> object:
        try:
            return json.loads(self.body)
        except ValueError:
            return None


def fetch(url: str, headers: dict[str, str] | None = None, context: ssl.SSLContext | None = None) -> Answer | str:
    """GET ``url`` within ANSWER_TIMEOUT_S: its answer (any status), or why there was none ("did not answer ...")."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=ANSWER_TIMEOUT_S, context=context) as response:
            return Answer(response.status, response.headers.get_content_type(), response.read(ANSWER_READ_BYTES))
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, exc.headers.get_content_type() if exc.headers else "", exc.read(ANSWER_READ_BYTES))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return f"did not answer ({getattr(exc, 'reason', exc)}; waited at most {ANSWER_TIMEOUT_S:.0f} s)"


def no_answer(url: str, ray: bool = False) -> str | None:
    """Why ``url`` did not answer within ANSWER_TIMEOUT_S (a clause "did not answer ..."), or None when it did.

    Any HTTP answer counts (authentication is checked later), except a 404 from a Ray address:
    that is a server that is not a Ray job server, or a network gateway answering for an
    address it cannot route.
    """
    answer = fetch(url)
    if isinstance(answer, str):
        return answer
    if ray and answer.status == 404:
        return f"did not answer as a Ray job server (HTTP 404 for {urlparse(url).path})"
    return None
