"""pmap dispatch: `fastpjit.pmap` against `jax.pmap` and the raw executable

Each case calls one pmapped function the same way on three sides: `fastpjit.pmap`, `jax.pmap`,
and the floor, which is the very executable that both run (JAX's jit over `shard_map`, taken
from JAX's own cache miss) called through `LoadedExecutable.execute_sharded` on inputs already
on the devices, its outputs built by the same result handlers. Inputs are already laid out as
a previous pmap leaves them, except in the numpy case, where ours and JAX's take the host array
and the floor takes it already placed. Every case checks that ours and JAX's outputs agree
(values, dtype, sharding) before timing.
"""

from __future__ import annotations

import jax
import numpy as np

import fastpjit
from fastpjit._jax.jit_miss import pmap_cache_miss
from fastpjit._jax.rust_handles import batched_device_put
from fastpjit.bench.floors import pmap_floor, runner
from fastpjit.bench.harness import Case, Sides

COLUMNS = ("devices", "args")
GOAL_OVERHEAD_RATIO = 0.2
GOAL_ONE_DEVICE = 1.1
NO_GOAL = ("100 arguments, 1 device", "numpy input, 8 devices, floor placing anew")


def _same(ours, theirs) -> bool:
    pairs = zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True)
    return all(
        a.sharding == b.sharding and a.dtype == b.dtype and np.array_equal(a, b) for a, b in pairs
    )


def _sides(fun, devices: int, args, floor_args=None, **options) -> Sides:
    device_list = jax.devices()[:devices]
    ours = fastpjit.pmap(fun, devices=device_list, **options)
    theirs = jax.pmap(fun, devices=device_list, **options)
    floor = pmap_floor(theirs, floor_args if floor_args is not None else args, {})
    return Sides(ours=lambda: ours(*args), jax=lambda: theirs(*args), floor=floor, check=_same)


def _placed(devices: int, *shape: int):
    host = np.arange(devices * int(np.prod(shape)), dtype=np.float32).reshape(devices, *shape)
    return jax.pmap(lambda v: v, devices=jax.devices()[:devices])(host)


def _trivial(devices: int) -> Sides:
    return _sides(lambda v: v + 1, devices, (_placed(devices, 4),))


def _numpy_input() -> Sides:
    host = np.arange(32, dtype=np.float32).reshape(8, 4)
    return _sides(lambda v: v + 1, 8, (host,), floor_args=(_placed(8, 4),))


def _numpy_placed_each_call() -> Sides:
    """The numpy case against a floor that places the host array anew on every call, as any
    dispatcher must: jaxlib's `batched_device_put` of its rows, already sliced, then the raw
    executable call of the numpy case's floor."""
    sides = _numpy_input()
    host = np.arange(32, dtype=np.float32).reshape(8, 4)
    placed = _placed(8, 4)
    theirs = jax.pmap(lambda v: v + 1, devices=jax.devices()[:8])
    fast_path = pmap_cache_miss(theirs, (placed,), {}).fast_path
    sharding = fast_path.in_shardings[0]
    indices = sharding.addressable_devices_indices_map(host.shape)
    shards, devices = [host[index] for index in indices.values()], list(indices)
    run = runner(fast_path)

    def floor():
        return run([batched_device_put(placed.aval, sharding, shards, devices)])

    assert _same(floor(), sides.jax())
    return Sides(ours=sides.ours, jax=sides.jax, floor=floor, check=_same)


def _many_args(count: int, devices: int = 8) -> Sides:
    args = tuple(_placed(devices, 2) for _ in range(count))
    return _sides(lambda *vs: sum(vs), devices, args)


CASES = [
    Case("trivial, 1 device", build=lambda: _trivial(1), devices=8, meta={"devices": 1, "args": 1}),
    Case(
        "trivial, 8 devices", build=lambda: _trivial(8), devices=8, meta={"devices": 8, "args": 1}
    ),
    Case("numpy input, 8 devices", build=_numpy_input, devices=8, meta={"devices": 8, "args": 1}),
    # No goal: the numpy case against the least that placing the array on every call costs.
    Case(
        "numpy input, 8 devices, floor placing anew",
        build=_numpy_placed_each_call,
        devices=8,
        meta={"devices": 8, "args": 1},
    ),
    Case(
        "100 arguments, 8 devices",
        build=lambda: _many_args(100),
        devices=8,
        meta={"devices": 8, "args": 100},
    ),
    # No goal: the same dispatch as the row above without 8 devices' executions, whose
    # run-to-run spread there is larger than either dispatcher's cost per argument.
    Case(
        "100 arguments, 1 device",
        build=lambda: _many_args(100, 1),
        devices=8,
        meta={"devices": 1, "args": 100},
    ),
]


def notes(rows, processes) -> str:
    """The issue's goals, measured."""
    lines = ["**Goals.**"]
    for row in rows:
        ratio = row.get("overhead_ratio")
        if ratio is None or row["name"] in NO_GOAL:
            continue
        met = ratio <= GOAL_OVERHEAD_RATIO
        lines.append(
            f"- {row['name']}: our overhead above the floor is {ratio:.2f} of "
            f"jax.pmap's (goal ≤ {GOAL_OVERHEAD_RATIO}), "
            f"{'met' if met else '**not met**'}."
        )
    one = next((row for row in rows if row["name"] == "trivial, 1 device"), None)
    if one is not None and one.get("floor_us"):
        within = one["ours_us"] / one["floor_us"]
        met = within <= GOAL_ONE_DEVICE
        lines.append(
            f"- 1 device, the whole call within 10% of the floor: "
            f"{within:.2f}× the floor, {'met' if met else '**not met**'}."
        )
    numpy_row = next((row for row in rows if row["name"] == "numpy input, 8 devices"), None)
    anew = next((row for row in rows if row["name"] == NO_GOAL[1]), None)
    if numpy_row is not None and anew is not None and numpy_row["floor_us"] is not None:
        allowed = numpy_row["floor_us"] + GOAL_OVERHEAD_RATIO * (
            numpy_row["jax_us"] - numpy_row["floor_us"]
        )
        lines.append(
            f"- The numpy goal allows {allowed:.0f} µs a call; placing the array anew "
            f"with jaxlib's `batched_device_put` and calling the raw executable takes "
            f"{anew['floor_us']:.0f} µs by itself (fastpjit {anew['ours_us']:.0f}, "
            f"jax.pmap {anew['jax_us']:.0f} in that row)."
        )
    few = next((row for row in rows if row["name"] == "100 arguments, 1 device"), None)
    if few is not None and few.get("overhead_ratio") is not None:
        per_arg = {
            side: (few[f"{side}_us"] - few["floor_us"]) * 1e3 / few["args"]
            for side in ("ours", "jax")
        }
        lines.append(
            f"- 100 arguments on 1 device (no goal; the dispatch alone, without 8 "
            f"devices' run-to-run spread): overhead ratio {few['overhead_ratio']:.2f}, "
            f"about {per_arg['ours']:.0f} ns per argument for fastpjit and "
            f"{per_arg['jax']:.0f} for jax.pmap."
        )
    return "\n".join(lines)
