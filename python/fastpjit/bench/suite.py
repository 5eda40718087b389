"""The standard dispatch suite of `python -m fastpjit.bench`: the call-pattern matrix (jit,
pmap, AOT calls), bound calls and transfers, on one device and on all of this process's."""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from fastpjit.bench import calls
from fastpjit.bench.benchmark import call_sides
from fastpjit.bench.harness import Call, Case, Settings, Sides, same_result
from fastpjit.jit import jit
from fastpjit.transfer import device_put

__all__ = ["QUICK_ROWS", "cases", "settings"]

# The rows that `--quick` runs (by how their names end): one of each kind of call, on each
# device count.
QUICK_ROWS = (
    ": f(x)",
    "f(x, s): s = 1.0, 2, True in turn",
    "f(params, x, lr=0.1), 100 leaves",
    "AOT compiled f(x)",
    "state = f(state, x), donated",
    "bind(100 parameters)",
    "B numpy array, P('x')",
)
SMALL_BYTES = 1 << 10
LARGE_BYTES = 16 << 20


def settings(quick: bool) -> Settings:
    """Short rounds for --quick; otherwise `benches/`' rounds, with single-call percentiles."""
    return (
        Settings(rounds=9, round_s=0.01, singles=5)
        if quick
        else Settings(rounds=25, round_s=0.04, singles=20)
    )


def cases(quick: bool = False) -> list[Case]:
    """The suite's rows on the default backend's devices."""
    count = len(jax.devices())
    widths = (1, count) if count > 1 else (1,)
    rows = calls.cases(widths)
    for d in widths:
        for leaves in (100, 1000):
            rows.append(
                Case(
                    f"bound, {d} dev: g(x), g = jit(step).bind({leaves} parameters)",
                    build=partial(_bound, leaves, d),
                    meta={"kind": "bound", "devices": d},
                )
            )
    for nbytes in (SMALL_BYTES, LARGE_BYTES):
        rows.append(
            Case(
                f"device_put, {count} dev: {nbytes:,} B numpy array, P('x')",
                build=partial(_device_put, nbytes, count),
                meta={"kind": "transfer", "devices": count, "bytes": nbytes},
            )
        )
    if quick:
        rows = [case for case in rows if case.name.endswith(QUICK_ROWS)]
    return rows


def serve_step(params: Any, x: jax.Array) -> jax.Array:
    # Every parameter is an input of the executable, as a model's weights are.
    total = jnp.stack([p.sum() for p in jax.tree.leaves(params)]).sum()
    return jnp.tanh(x) * total


def _bound(leaves: int, devices: int) -> Sides:
    """A serving call: the same parameters bound once, a small new input each call."""
    mesh = jax.make_mesh((devices,), ("x",), devices=jax.devices()[:devices])
    params = jax.device_put(
        {f"layer{i:04d}": np.full((4,), i / leaves, np.float32) for i in range(leaves)},
        NamedSharding(mesh, P()),
    )
    x = jax.device_put(np.ones((8, 4), np.float32), NamedSharding(mesh, P("x")))
    return call_sides(jit(serve_step).bind(params), (x,), {})


def _device_put(nbytes: int, devices: int) -> Sides:
    """A numpy array split over the devices; the floor copies its bytes once, into memory
    already touched."""
    x = np.arange(nbytes // 4, dtype=np.float32).reshape(devices, -1)
    sharding = NamedSharding(jax.make_mesh((devices,), ("x",)), P("x"))
    out = np.zeros_like(x)
    return Sides(
        ours=lambda: device_put(x, sharding).block_until_ready(),
        jax=lambda: jax.device_put(x, sharding).block_until_ready(),
        floor=Call(lambda: np.copyto(out, x)),
        check=same_result,
    )
