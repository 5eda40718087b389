"""Index maps, cold: `devices_indices_map` and `indices_array` against JAX with its caches cleared

Which slice of a global array each device holds, computed from scratch. JAX memoises this
computation (`common_devices_indices_map`, `_addressable_devices_indices_map`,
`_common_shard_shape`, `named_sharding_to_xla_hlo_sharding`, `device_replica_id_map`); every one
of those caches is cleared before each timed JAX call, untimed, and each case checks once that a
JAX call so prepared hits JAX's caches no more than one made after `jax.clear_caches()`.
fastpjit has no cache. What stays warm on both sides are per-object properties of the interned
`Mesh` (its flat device tuple, its shape), which a program builds once.

- **devices_indices_map** rows: a `NamedSharding` over a 2-D mesh of real CPU devices
  (`Mesh(devices.reshape(a, b), ('x', 'y'))`), fully sharded `P('x', 'y')` or partly
  replicated `P('y')` (dimension 0 split over `y`, copies along `x`). Ours is
  `fastpjit.devices_indices_map(s, shape)`, JAX's `s.devices_indices_map(shape)`; both return a
  `{device: (slice, ...)}` dict, checked equal key by key and in order. The floor is building
  that dict from its parts made beforehand: `dict(zip(devices, indices))`.
- **indices_array** rows: the same specs over a `jax.sharding.AbstractMesh`, which has no
  devices. Ours is `fastpjit.indices_array(s, shape)`, an int64 array of `[start, stop)`
  bounds per device position; JAX's equivalent is its own pure-Python computation,
  `op_sharding_to_indices(named_sharding_to_xla_hlo_sharding(s, ndim), shape, n)`, a tuple of
  slice tuples, converted to bounds for the check. The floor is copying an array of that size.

Meshes of more than 8 devices run in a child process started with
`XLA_FLAGS=--xla_force_host_platform_device_count=N`; the global shape is (8192, 8192) throughout.
"""

from __future__ import annotations

import jax
import numpy as np
from jax._src import named_sharding as jax_named_sharding
from jax._src import op_shardings as jax_op_shardings
from jax._src import sharding as jax_sharding
from jax._src import sharding_impls as jax_sharding_impls
from jax._src import util as jax_util
from jax.sharding import AbstractMesh, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import fastpjit
from fastpjit.bench.harness import Call, Case, Plot, Sides, loglog_slope

SHAPE = (8192, 8192)
MESHES = {8: (2, 4), 64: (8, 8), 512: (16, 32), 4096: (64, 64), 32768: (128, 256)}
SPECS = {"P('x', 'y')": P("x", "y"), "P('y')": P("y")}
REAL_DEVICES = (8, 64, 512, 4096)
ABSTRACT_DEVICES = (512, 4096, 32768)
GOAL_DEVICES = 4096
GOAL_SPEEDUP = 20.0
# Prototype timings quoted in the notes, measured once at commit 2203351 (see the notes).
PROTOTYPE_DICT_US, CURRENT_DICT_US, PROTOTYPE_ARRAY_US = 179, 411, 50

COLUMNS = ("devices", "mesh", "spec")
PLOT = Plot(
    file="index_maps.png",
    x="devices",
    series="spec",
    panel="api",
    title="Cold index maps: µs per call against devices (log-log)",
    xlabel="devices (mesh positions)",
)


# JAX's memo caches on the devices_indices_map path, cleared for a cold call.
_INDEX_MAP_CACHES = (
    jax_sharding.common_devices_indices_map,
    jax_sharding._addressable_devices_indices_map,
    jax_sharding._common_shard_shape,
    jax_named_sharding.named_sharding_to_xla_hlo_sharding,
    jax_sharding_impls.device_replica_id_map,
)


def _clear_index_map_caches() -> None:
    """Empties JAX's memo caches on the devices_indices_map path, so its next call runs cold."""
    for cache in _INDEX_MAP_CACHES:
        cache.cache_clear()


def _jax_cache_counts() -> tuple[int, int]:
    """(hits, misses) so far, summed over every cache that JAX registers."""
    infos = [c.cache_info() for c in list(jax_util._caches) if hasattr(c, "cache_info")]
    return sum(info.hits for info in infos), sum(info.misses for info in infos)


def _jax_indices_from_named(sharding, shape, num_devices):
    """JAX's own per-position indices of a NamedSharding, abstract meshes included."""
    hlo = jax_named_sharding.named_sharding_to_xla_hlo_sharding(sharding, len(shape))
    return jax_op_shardings.op_sharding_to_indices(hlo, shape, num_devices)


def _cache_counts(clear, fn) -> tuple[int, int]:
    """The cache hits and misses of JAX's caches during `fn()`, after `clear()`."""
    clear()
    hits, misses = _jax_cache_counts()
    fn()
    hits_after, misses_after = _jax_cache_counts()
    return hits_after - hits, misses_after - misses


def _cold_jax(fn) -> Call:
    """JAX's call, with its index-map caches cleared before each call.

    Checks once that this is as cold as clearing every cache JAX has (`jax.clear_caches()`):
    a cache left warm would turn one of that call's misses into a hit.
    """
    everything = _cache_counts(jax.clear_caches, fn)
    ours = _cache_counts(_clear_index_map_caches, fn)
    if ours != everything:
        raise AssertionError(
            f"a JAX cache stayed warm: (hits, misses) {ours} after clearing "
            f"the index-map caches, {everything} after clearing all"
        )
    return Call(fn, setup=_clear_index_map_caches)


def _same_dict(ours, theirs):
    """Equal, and in the same device order (callers such as JAX's shard_args rely on it)."""
    assert ours == theirs, "index maps differ"
    assert list(ours) == list(theirs), "device order differs"


def _named(devices: int, spec_name: str) -> Sides:
    mesh = Mesh(np.array(jax.devices()[:devices]).reshape(MESHES[devices]), ("x", "y"))
    sharding = NamedSharding(mesh, SPECS[spec_name])
    theirs = sharding.devices_indices_map(SHAPE)
    device_list, indices = list(theirs), list(theirs.values())
    return Sides(
        ours=lambda: fastpjit.devices_indices_map(sharding, SHAPE),
        jax=_cold_jax(lambda: sharding.devices_indices_map(SHAPE)),
        floor=lambda: dict(zip(device_list, indices, strict=True)),
        check=_same_dict,
    )


def _bounds(indices, shape) -> np.ndarray:
    """JAX's slice tuples as fastpjit's (devices, ndim, 2) array of [start, stop) bounds."""
    return np.array(
        [[s.indices(size)[:2] for s, size in zip(index, shape, strict=True)] for index in indices],
        dtype=np.int64,
    )


def _abstract(devices: int, spec_name: str) -> Sides:
    mesh = AbstractMesh(MESHES[devices], ("x", "y"))
    sharding = NamedSharding(mesh, SPECS[spec_name])
    made = fastpjit.indices_array(sharding, SHAPE)
    return Sides(
        ours=lambda: fastpjit.indices_array(sharding, SHAPE),
        jax=_cold_jax(lambda: _jax_indices_from_named(sharding, SHAPE, devices)),
        floor=made.copy,
        check=lambda ours, theirs: np.array_equal(ours, _bounds(theirs, SHAPE)),
    )


def _case(api: str, devices: int, spec_name: str) -> Case:
    real = api == "devices_indices_map"
    build = _named if real else _abstract
    mesh = "x".join(map(str, MESHES[devices])) + ("" if real else " abstract")
    return Case(
        name=f"{api} {devices} {spec_name}",
        build=lambda: build(devices, spec_name),
        devices=devices if real else None,
        meta={"api": api, "devices": devices, "mesh": mesh, "spec": spec_name},
    )


CASES = [
    *(_case("devices_indices_map", n, spec) for n in REAL_DEVICES for spec in SPECS),
    *(_case("indices_array", n, spec) for n in ABSTRACT_DEVICES for spec in SPECS),
]


def _row(rows, api: str, devices: int, spec: str):
    return next(
        (row for row in rows if (row["api"], row["devices"], row["spec"]) == (api, devices, spec)),
        None,
    )


def notes(rows, processes) -> str:
    """The goals (≥20× at 4096 devices, linear in devices), measured, and where the time goes."""
    lines = ["**Goals.**"]
    unmet = False
    for spec in SPECS:
        row = _row(rows, "devices_indices_map", GOAL_DEVICES, spec)
        if row is not None:
            met = row["speedup"] >= GOAL_SPEEDUP
            unmet |= not met
            lines.append(
                f"- ≥{GOAL_SPEEDUP:.0f}× faster than JAX at {GOAL_DEVICES} devices, "
                f"{spec}: {row['speedup']:.1f}×, {'met' if met else '**not met**'}."
            )
    for spec in SPECS:
        row = _row(rows, "indices_array", max(ABSTRACT_DEVICES), spec)
        if row is not None:
            met = row["speedup"] >= GOAL_SPEEDUP
            unmet |= not met
            lines.append(
                f"- The same bar for indices_array on {row['devices']} abstract "
                f"devices, {spec}: {row['speedup']:.1f}×, "
                f"{'met' if met else '**not met**'}."
            )
    lines.append(
        "- Linear in devices: the slope of log µs against log devices, fitted from "
        "64 devices up (1.0 is linear):"
    )
    for api in ("devices_indices_map", "indices_array"):
        for spec in SPECS:
            points = [
                row
                for row in rows
                if row["api"] == api and row["spec"] == spec and row["devices"] >= 64
            ]
            if len(points) < 2:
                continue
            devices = [row["devices"] for row in points]
            slopes = {
                side: loglog_slope(devices, [row[f"{side}_us"] for row in points])
                for side in ("ours", "jax")
            }
            lines.append(
                f"  - {api} {spec}: fastpjit {slopes['ours']:.2f}, JAX {slopes['jax']:.2f}."
            )
    big = [p for p in processes if p["devices"] > 8]
    if big:
        lines += [
            "",
            "**Many CPU devices are feasible:** "
            + "; ".join(
                f"{p['devices']} devices started in {p['startup_s']:.1f} s and peaked at "
                f"{p['max_rss_mib']:,} MiB"
                for p in big
            )
            + " (start-up counts from the script's "
            "start to JAX's device list, imports included), so every mesh here is made of real "
            "CPU devices; only the 32,768-position meshes are abstract.",
        ]
    if unmet:
        lines += ["", _where_the_time_goes(rows)]
    return "\n".join(lines)


def _where_the_time_goes(rows) -> str:
    """Why a goal is unmet: the dict that devices_indices_map must return costs too much."""
    floor_bound = [
        row
        for row in rows
        if row["api"] == "devices_indices_map"
        and row["devices"] == GOAL_DEVICES
        and row.get("floor_us")
    ]
    if not floor_bound:
        return ""
    best = max(row["jax_us"] / row["floor_us"] for row in floor_bound)
    return (
        "**Why the dict goal is out of reach:** no function that returns a new "
        "`{device: index}` dict can be 20× faster than JAX at "
        f"{GOAL_DEVICES} devices. Building that dict from ready-made parts (the floor) is "
        f"at most {best:.1f}× faster than JAX in this run, and fastpjit's overhead above the "
        "floor is shown in the table. What remains is for fastpjit's own callers (the shard "
        "path, result handling) to use `indices_array`-style bounds, which need no Python "
        "objects, and to keep the dict for JAX compatibility only. Of the fixed cost at 4096 "
        "devices, about 20 µs is reading the mesh's devices (`mesh.devices.ravel().tolist()` "
        "and the copy into Rust) in `rust/bindings/src/sharding.rs`."
    )
