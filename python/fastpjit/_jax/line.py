"""The JAX line that runs: chosen once, at import, from jaxlib's extension version (the number
that JAX gates its own code on), with one clear error for a JAX that fastpjit does not support.

fastpjit supports two lines: jax and jaxlib 0.10.2 (the last for CPython 3.11), and 0.11.2 up to
0.12.x (CPython 3.12 and newer). Every difference between them that fastpjit meets is decided in
`fastpjit._jax` from `CURRENT` below; nothing else in fastpjit asks which JAX runs.
"""

from __future__ import annotations

from typing import Any

import jax
import jaxlib

# Modules only: an unsupported JAX fails at the check below, never at a private name read deep
# inside. jaxlib's xla_client has carried the extension version since long before 0.10.
from jax._src import config as _config
from jax._src import core as _core
from jax._src import mesh as _mesh
from jax._src.lib import jaxlib_extension_version
from jax._src.lib import xla_client as xc

SUPPORTED = "jax and jaxlib 0.10.2 (CPython 3.11), or 0.11.2 up to 0.12.x (CPython 3.12, 3.13)"

# jaxlib 0.10.2's extension version, and 0.11.2's: the first of the newer line.
EXTENSION_0_10 = 467
EXTENSION_0_11 = 495


def release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string: (0, 12, 0, 1) for "0.12.0.1", (0, 13) for
    "0.13.dev20261101"."""
    numbers = []
    for part in version.split("."):
        if not part.isdigit():
            break
        numbers.append(int(part))
    return tuple(numbers)


def supported(jax_version: str, jaxlib_version: str, extension: int) -> bool:
    """Whether fastpjit runs beside this jax and jaxlib."""
    if release(jax_version) == release(jaxlib_version) == (0, 10, 2):
        return extension == EXTENSION_0_10
    return extension >= EXTENSION_0_11 and all(
        (0, 11, 2) <= release(v) < (0, 13) for v in (jax_version, jaxlib_version)
    )


if not supported(jax.__version__, jaxlib.__version__, jaxlib_extension_version):
    raise ImportError(
        f"fastpjit supports {SUPPORTED}; this is jax {jax.__version__} with jaxlib "
        f"{jaxlib.__version__}. Install a supported JAX (pip install fastpjit resolves one for "
        "your Python), or a fastpjit that supports yours."
    )

# The running line: "0.10" or "0.11" (0.11.2 to 0.12.x, which fastpjit meets alike).
CURRENT = "0.10" if jaxlib_extension_version < EXTENSION_0_11 else "0.11"
ON_0_10 = CURRENT == "0.10"

# --- What differs, each chosen here once ----------------------------------------------------

# Mutual TLS between jax.distributed's coordinator and its processes, from the jax_mtls_*
# options (JAX_MTLS_CERT_FILE, ...): 0.11.2 added it; 0.10.2 would ignore the variables.
COORDINATOR_MTLS = not ON_0_10

# The states that only JAX's jit key holds, beyond its trace context: the trace state (a weak
# reference to the active trace, so that a call made while a trace is active misses and is
# staged), set_mesh's concrete mesh (two meshes of one abstract mesh trace alike; in
# `jax._src.mesh` from 0.11.2, where its default became an empty Mesh), the optimization levels,
# and from 0.11.2 Pallas's collective ids. All are C++ objects; tests/test_jax_boundary.py
# finds them in JAX's sources, so that a JAX that adds one fails there. (mypy reads one line's
# JAX: a name of the other line is unknown to it.)
jit_key_states = (
    _core.trace_state,
    _config.device_context if ON_0_10 else _mesh.device_context,  # type: ignore[attr-defined]
    _config.optimization_level,
    _config.memory_fitting_level,
    *(
        ()
        if ON_0_10
        else (
            _config.jax_pallas_auto_assign_collective_ids,  # type: ignore[attr-defined]
            _config.jax_pallas_auto_assign_collective_ids_limit,  # type: ignore[attr-defined]
        )
    ),
)


# The function that flattens a class registered with `jax.tree_util.register_dataclass`, by its
# module and qualified name (its closure holds the fields): from jax 0.12 a private function of
# another name registers dataclasses, within the 0.11 line.
TREE_UTIL = "jax._src.tree_util"
DATACLASS_FLATTEN = (
    "register_dataclass.<locals>.flatten_func",
    "_register_dataclass.<locals>.flatten_func",
)


def array_result_handler(aval: Any, sharding: Any, committed: bool) -> Any:
    """jaxlib's handler that wraps an executable's output buffers as a jax.Array of `aval` on
    `sharding`. jaxlib 0.10 checks the buffers unless told to skip it (JAX does); from 0.11.2
    (extension version 489) it never checks them, and the keyword is gone."""
    if ON_0_10:
        return xc.array_result_handler(aval, sharding, committed=committed, _skip_checks=True)
    return xc.array_result_handler(aval, sharding, committed=committed)


def indivisible_message(
    sharding: str | None,
    axis: int,
    partitions: int,
    size: int,
    shape: tuple[int, ...],
    tiling: list[int],
) -> str:
    """JAX's IndivisibleError text: `sharding` (its repr; None where there is no sharding
    object) splits `axis` of `shape` into `partitions`, which do not divide `size`. JAX 0.10
    opens it with "Sharding " and prints the tiling factors as a list; 0.11 does neither."""
    if sharding is None:
        subject = "The sharding"
    else:
        subject = f"Sharding {sharding}" if ON_0_10 else sharding
    factors = tiling if ON_0_10 else tuple(tiling)
    return (
        f"{subject} implies that array axis {axis} is partitioned {partitions} times, but the "
        f"dimension size is {size} (full shape: {shape}, per-dimension tiling factors: "
        f"{factors} should evenly divide the shape)"
    )


def array_was_donated(array: Any) -> bool:
    """Whether a deleted array was donated to a computation rather than deleted by `delete()`,
    where JAX raises another error for each: on 0.10 its cached path raises a ValueError for a
    donated array and a RuntimeError for a deleted one. jaxlib 0.10 keeps a donated array's
    device array (which still knows its size) and drops a deleted one's. From 0.11.2 JAX raises
    the deleted array's RuntimeError for both."""
    if not ON_0_10:
        return False
    try:
        array.on_device_size_in_bytes()
    except Exception:
        return False
    return True
