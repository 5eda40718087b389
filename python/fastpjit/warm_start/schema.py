"""What a record holds, shared by the modules that write, check and replay one: its schema and
version, the bounds that keep a hostile record small, the versions that wrote it, and how a
NamedTuple is named in it."""

from __future__ import annotations

import importlib.metadata
import re
import sys
from collections.abc import Mapping
from typing import Any

import jax

from fastpjit._core import __version__

SCHEMA = "fastpjit.signatures"
# 2: NamedTuple nodes. 3: a signature's compile options (`with_compiler_options`).
SCHEMA_VERSION = 3
# Bounds on what a record may hold, so that a hostile one cannot exhaust memory or the stack.
MAX_RECORD_BYTES = 64 << 20
MAX_DEPTH = 64
MAX_NDIM = 64
MAX_DIM = 1 << 48
MAX_NODES = 1 << 20

# A call's signature (`describe_call`) and a record (`save_signatures`) are JSON data: objects
# of the shapes that `check.py` checks, tagged by their keys.
Signature = dict[str, Any]
Record = dict[str, Any]

# A NamedTuple's type in a record: `module:qualname`.
TYPE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def named_type(name: str) -> object:
    """The type of this `module:qualname` in a module already imported, or None. Finding it
    reads the namespaces' dicts: no import, no module `__getattr__`, so that a record never
    runs code."""
    module, _, qualname = name.partition(":")
    found: object = sys.modules.get(module)
    for part in qualname.split("."):
        namespace = getattr(found, "__dict__", None)
        if not isinstance(namespace, Mapping):
            return None
        found = namespace.get(part)
    return found


def versions() -> dict[str, str]:
    """The versions that a record is written with, and replayed only under."""
    return {
        "fastpjit": __version__,
        "jax": jax.__version__,
        "jaxlib": importlib.metadata.version("jaxlib"),
    }
