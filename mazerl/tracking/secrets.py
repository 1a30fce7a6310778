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

    Only text is read (:func:`readable_text`): a weights file is a few MB of arbitrary bytes, in
    which ``scheme://user:password@`` turns up by chance (a merged starter's did), so scanning it
    would refuse a model for a credential that is not there.
    """
    environ = os.environ if environ is None else environ
    wanted = set(secret_values(environ))
    named = {value: name for name, value in environ.items() if value in wanted}
    found: list[str] = []
    for path in paths:
        text = readable_text(Path(path), max_bytes)
        if text is None:
            continue
        found += [f"{path}: the value of ${named[value]}" for value in named if value in text]
        if _AWS_KEY_ID.search(text):
            found.append(f"{path}: an AWS access key id")
        if _URL_PASSWORD.search(text):
            found.append(f"{path}: a password in a URL")
    return found


def readable_text(path: Path, max_bytes: int) -> str | None:
    """The text of ``path`` that a credential could be written into, or None for a file with none.

    A ``.safetensors`` file: its JSON header (tensor names, shapes and the free-form metadata), not
    its tensor bytes. Any other file: its content if it is UTF-8 text of at most ``max_bytes``;
    None if it is larger or binary (a NUL byte or invalid UTF-8: pickled weights, images).
    """
    if not path.is_file():
        return None
    if path.suffix == ".safetensors":
        with path.open("rb") as handle:
            length = int.from_bytes(handle.read(8), "little")
            header = handle.read(min(length, max_bytes))
        return header.decode("utf-8", errors="replace")
    if path.stat().st_size > max_bytes:
        return None
    data = path.read_bytes()
    if b"\x00" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None
