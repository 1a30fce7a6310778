"""Keep credentials out of MLflow: params, tags and text artifacts pass through here first.

MLflow stores everything it is given in plain text (the SQLite file, the artifact store,
a shared tracking server), so a leaked AWS key in a logged config is a leaked key. Two
independent filters:

- by name: a value whose key names a secret (a word ending in ``token``, ``secret``,
  ``password``, ``passwd`` or ``credential(s)``, or the word ``key``, ``apikey``,
  ``accesskey``, ...) is replaced by ``***``. ``max_new_tokens`` is not a secret:
  ``tokens`` is not ``token``.
- by value: the values of secret-named environment variables (``AWS_SECRET_ACCESS_KEY``,
  ``AWS_SESSION_TOKEN``, ``RAY_AUTH_TOKEN``, ``MLFLOW_TRACKING_PASSWORD``, ...), AWS access
  key ids and the password part of ``scheme://user:password@host`` URLs are cut out of any
  text, wherever they appear.

The environment is read at every call, so credentials set after import are covered too.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

REDACTED = "***"
_SECRET_WORDS = ("token", "secret", "password", "passwd", "credential", "credentials")  # also as a word's ending
_KEY_WORDS = ("key", "apikey", "accesskey", "secretkey", "privatekey", "signingkey", "sshkey")  # "monkey" is no key
# Values shorter than this are flags or modes ("1", "true", "token"), not secrets; masking
# them would garble every text that happens to contain them.
MIN_SECRET_VALUE_LENGTH = 8
_NOT_SECRET_VALUES = {"true", "false", "none", "null"}
_AWS_KEY_ID = re.compile(r"\b(?:AKIA|ASIA|AROA|AIDA)[A-Z0-9]{16}\b")
_URL_PASSWORD = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^\s/:@]+:)[^\s/@]+(?P<at>@)")
_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")


class SecretLeakError(RuntimeError):
    """A file about to be logged as an artifact contains a credential."""


def is_secret_name(name: str) -> bool:
    """True when a parameter, tag or environment variable name says its value is a credential."""
    words = [word.lower() for word in _WORD_SPLIT.split(str(name)) if word]
    return any(word in _KEY_WORDS or word.endswith(_SECRET_WORDS) for word in words)


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """Values of secret-named environment variables, longest first (so no prefix is left behind)."""
    environ = os.environ if environ is None else environ
    values = {
        value
        for name, value in environ.items()
        if is_secret_name(name)
        and len(value) >= MIN_SECRET_VALUE_LENGTH
        and value.strip().lower() not in _NOT_SECRET_VALUES
    }
    return sorted(values, key=len, reverse=True)


def scrub_text(text: str, environ: Mapping[str, str] | None = None) -> str:
    """``text`` with every known secret value, AWS key id and URL password replaced by ``***``."""
    for value in secret_values(environ):
        text = text.replace(value, REDACTED)
    text = _AWS_KEY_ID.sub(REDACTED, text)
    return _URL_PASSWORD.sub(lambda m: f"{m.group('head')}{REDACTED}{m.group('at')}", text)


def redact(values: Mapping[str, object], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Stringified ``values`` with secret-named entries masked and secret values scrubbed from the rest."""
    out: dict[str, str] = {}
    for key, value in values.items():
        text = "" if value is None else str(value)
        out[key] = REDACTED if is_secret_name(key) and text else scrub_text(text, environ)
    return out


def find_secrets(
    paths: Iterable[Path], environ: Mapping[str, str] | None = None, max_bytes: int = 16 * 2**20
) -> list[str]:
    """Descriptions (file and what matched, never the value) of secrets found in the text files given.

    Files larger than ``max_bytes`` (weights) are skipped: they are binary tensors, not text.
    """
    environ = os.environ if environ is None else environ
    wanted = set(secret_values(environ))
    named = {value: name for name, value in environ.items() if value in wanted}
    found: list[str] = []
    for path in paths:
        path = Path(path)
        if not path.is_file() or path.stat().st_size > max_bytes:
            continue
        text = path.read_bytes().decode("utf-8", errors="ignore")
        found += [f"{path}: the value of ${named[value]}" for value in named if value in text]
        if _AWS_KEY_ID.search(text):
            found.append(f"{path}: an AWS access key id")
        if _URL_PASSWORD.search(text):
            found.append(f"{path}: a password in a URL")
    return found
