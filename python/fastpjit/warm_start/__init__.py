"""Warm starts: the call signatures that fastpjit functions served, saved as a JSON record
(`save_signatures`), and compiled again by a new process before it takes traffic (`warm_up`).

A record is data, never code: JSON with a schema version and the versions that wrote it. A
signature holds each argument's kind, shape, dtype, weak type, commitment and sharding (mesh
shape, axis names, device ids and spec), its tree (tuples, lists, dicts, None, and NamedTuples
by the name of their type), the static arguments that are JSON values, keyword names, and the
configuration that keys a call (x64), and the compile options registered for it
(`with_compiler_options`). Replaying one calls the function once on zero-filled arguments of
that signature, compiled with those options, so that its first real call is a cache hit.

One module a job: `describe` (a call's signature), `log` (the signatures a function served),
`record` (the file: written, read), `check` (a loaded record against the schema, which `schema`
holds) and `replay` (`warm_up`).
"""

from __future__ import annotations

from fastpjit.warm_start.describe import Unrecordable, describe_call
from fastpjit.warm_start.log import SignatureLog
from fastpjit.warm_start.record import load_record, save_signatures
from fastpjit.warm_start.replay import MAX_BYTES, Skipped, WarmUpReport, warm_up
from fastpjit.warm_start.schema import SCHEMA, SCHEMA_VERSION

__all__ = [
    "MAX_BYTES",
    "SCHEMA",
    "SCHEMA_VERSION",
    "SignatureLog",
    "Skipped",
    "Unrecordable",
    "WarmUpReport",
    "describe_call",
    "load_record",
    "save_signatures",
    "warm_up",
]
