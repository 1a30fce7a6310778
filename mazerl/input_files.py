"""Reading a file a user hands in (``mazerl run --params``, a training job's ``--config``) without being hurt by it.

Only a regular file is opened (a FIFO would block the command forever, ``/dev/zero`` would be
read until memory runs out), at most :data:`MAX_INPUT_BYTES` of it, as UTF-8; its JSON (or YAML)
may nest at most :data:`MAX_NESTING` levels deep (Python's parser raises ``RecursionError`` near
a thousand, and the validation after it would recurse again). Every refusal is an
:class:`InputFileError` that names the file by the flag it came with, and says what to do.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

MAX_INPUT_BYTES = 1024 * 1024  # a pipeline's parameters or a training config are a few kB
MAX_NESTING = 32  # the deepest real input (training.grpo.<field>) nests 3 levels


class InputFileError(ValueError):
    """An input file that cannot be read as what it must be; the message names it and the fix."""


def read_input_text(path: str | os.PathLike, what: str, expected: str, kind: str = "JSON") -> str:
    """The UTF-8 text of a regular file of at most MAX_INPUT_BYTES.

    ``what`` names the file as the user gave it (``--params params.json``); ``expected`` says what it
    should be (``a JSON file of pipeline parameters``); ``kind`` its format.
    """
    try:
        # O_NONBLOCK: opening a FIFO without a writer would wait forever; the type is checked right after
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise InputFileError(f"{what} cannot be read ({exc.strerror}); give {expected}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputFileError(f"{what} is not a regular file (a {_kind(info.st_mode)}); give {expected}")
        if info.st_size > MAX_INPUT_BYTES:
            raise InputFileError(
                f"{what} is {info.st_size} bytes, more than the {MAX_INPUT_BYTES} an input file may have; give {expected}"
            )
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(MAX_INPUT_BYTES + 1)
    except OSError as exc:
        raise InputFileError(f"{what} cannot be read ({exc.strerror}); give {expected}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_INPUT_BYTES:  # it grew while being read
        raise InputFileError(f"{what} holds more than {MAX_INPUT_BYTES} bytes; give {expected}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputFileError(
            f"{what} is not UTF-8 text (byte {data[exc.start]:#04x} at position {exc.start}); save it as UTF-8 {kind}"
        ) from None


def parse_json(text: str, what: str, example: str) -> Any:
    """``text`` as JSON, refused (naming ``what``) where it is not JSON or nests deeper than MAX_NESTING."""
    _check_bracket_depth(text, what, example)
    try:
        return json.loads(text)
    except RecursionError:  # a depth the bracket count missed cannot pass the parser either
        raise InputFileError(f"{what} nests too deeply; give a JSON object, e.g. {example}") from None
    except json.JSONDecodeError as exc:
        raise InputFileError(f"{what} is not valid JSON ({exc}); give a JSON object, e.g. {example}") from None


def check_nesting(value: Any, what: str) -> None:
    """Refuse a parsed value (JSON or YAML) nested deeper than MAX_NESTING, without recursing."""
    stack, seen = [(value, 1)], set()
    while stack:
        item, depth = stack.pop()
        if id(item) in seen:  # a YAML alias: the same object again (walking it each time would take exponential time)
            continue
        if isinstance(item, dict | list):
            seen.add(id(item))
        if depth > MAX_NESTING:
            raise InputFileError(
                f"{what} nests deeper than {MAX_NESTING} levels; an input of mazerl nests a few (e.g. "
                '{"training": {"grpo": {"temperature": 1.0}}})'
            )
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((child, depth + 1) for child in children)


def _check_bracket_depth(text: str, what: str, example: str) -> None:
    """Refuse text whose brackets nest deeper than MAX_NESTING before the recursive parser sees it."""
    depth = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > MAX_NESTING:
                raise InputFileError(
                    f"{what} nests deeper than {MAX_NESTING} levels; give a JSON object of a few levels, e.g. {example}"
                )
        elif char in "]}":
            depth -= 1


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "directory"),
        (stat.S_ISFIFO, "named pipe"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
    ):
        if test(mode):
            return name
    return "special file"


def read_json_file(path: str | os.PathLike, what: str, expected: str, example: str) -> Any:
    """A regular, bounded, UTF-8 JSON file, parsed (any JSON value: the caller checks its type)."""
    return parse_json(read_input_text(path, what, expected), what, example)


def read_config_file(path: str | os.PathLike, what: str) -> Any:
    """A JSON or YAML config file (by suffix), read and parsed under the same bounds."""
    text = read_input_text(path, what, "a JSON or YAML training config file", kind="JSON or YAML")
    if Path(path).suffix in (".yaml", ".yml"):
        import yaml  # a dependency of the training entry that reads YAML configs

        try:
            value = yaml.safe_load(text)
        except RecursionError:
            raise InputFileError(f"{what} nests too deeply") from None
        check_nesting(value, what)
        return value
    return parse_json(text, what, '{"run_id": "r", "steps": 40}')
