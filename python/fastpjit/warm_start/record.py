"""The record file: `save_signatures` writes the signatures that fastpjit functions served as
JSON, and `load_record` reads one back and checks it, running nothing."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from typing import Any, NoReturn

from fastpjit.warm_start.check import check_record
from fastpjit.warm_start.log import log_of
from fastpjit.warm_start.schema import (
    MAX_RECORD_BYTES,
    SCHEMA,
    SCHEMA_VERSION,
    Record,
    versions,
)

__all__ = ["load_record", "save_signatures"]


def save_signatures(path: str | os.PathLike[str], functions: Mapping[str, Any]) -> Record:
    """Writes the signatures that each fastpjit function in `functions` (a mapping from a
    stable name to the function) has served to `path` as JSON, and returns the record."""
    if not isinstance(functions, Mapping):
        raise TypeError(
            f"functions: expected a mapping from names to fastpjit functions, "
            f"got {type(functions).__qualname__}"
        )
    record: Record = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "versions": versions(),
        "functions": {},
    }
    for name, fn in functions.items():
        if not isinstance(name, str):
            raise TypeError(f"functions: names must be str, got {name!r}")
        log = log_of(fn)
        record["functions"][name] = {
            "signatures": log.signatures(),
            "unrecordable": dict(log.unrecordable),
        }
    text = json.dumps(record, indent=1, allow_nan=False)
    tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as out:
        out.write(text)
    os.replace(tmp, path)
    return record


def load_record(path: str | os.PathLike[str]) -> Record:
    """Reads and checks a record; raises ValueError naming what is wrong. Runs nothing."""
    name = os.fspath(path)
    # Without blocking: a named pipe opens at once (and is refused), where a plain open would
    # wait for a writer.
    fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"invalid signature record {name!r}: not a regular file")
        with open(fd, "rb", closefd=False) as source:
            data = source.read(MAX_RECORD_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_RECORD_BYTES:
        raise ValueError(f"invalid signature record {name!r}: larger than {MAX_RECORD_BYTES} bytes")
    try:
        record = json.loads(
            data.decode("utf-8"), parse_constant=_no_constant, object_pairs_hook=_unique_keys
        )
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise ValueError(f"invalid signature record {name!r}: not JSON ({error})") from None
    return check_record(record)


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"invalid signature record: {name} is not a JSON value")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, whose keys must differ: JSON itself keeps the last of a repeated key."""
    out = dict(pairs)
    if len(out) != len(pairs):
        keys = [key for key, _ in pairs]
        twice = next(key for i, key in enumerate(keys) if key in keys[:i])
        raise ValueError(f"invalid signature record: an object has the key {twice!r} twice")
    return out
