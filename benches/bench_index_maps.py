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

import fastpjit
import jax
import numpy as np
from fastpjit import _jax
from harness import Call, Case, Plot, Sides, loglog_slope
from jax.sharding import AbstractMesh, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

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
PLOT = Plot(file="index_maps.png", x="devices", series="spec", panel="api",
            title="Cold index maps: µs per call against devices (log-log)",
            xlabel="devices (mesh positions)")


def _cache_counts(clear, fn) -> tuple[int, int]:
    """The cache hits and misses of JAX's caches during `fn()`, after `clear()`."""
    clear()
    hits, misses = _jax.jax_cache_counts()
    fn()
    hits_after, misses_after = _jax.jax_cache_counts()
    return hits_after - hits, misses_after - misses


def _cold_jax(fn) -> Call:
    """JAX's call, with its index-map caches cleared before each call.

    Checks once that this is as cold as clearing every cache JAX has (`jax.clear_caches()`):
    a cache left warm would turn one of that call's misses into a hit.
    """
    everything = _cache_counts(jax.clear_caches, fn)
    ours = _cache_counts(_jax.clear_index_map_caches, fn)
    if ours != everything:
        raise AssertionError(f"a JAX cache stayed warm: (hits, misses) {ours} after clearing "
                             f"the index-map caches, {everything} after clearing all")
    return Call(fn, setup=_jax.clear_index_map_caches)


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
    return np.array([[s.indices(size)[:2] for s, size in zip(index, shape, strict=True)]
                     for index in indices], dtype=np.int64)


def _abstract(devices: int, spec_name: str) -> Sides:
    mesh = AbstractMesh(MESHES[devices], ("x", "y"))
    sharding = NamedSharding(mesh, SPECS[spec_name])
    made = fastpjit.indices_array(sharding, SHAPE)
    return Sides(
        ours=lambda: fastpjit.indices_array(sharding, SHAPE),
        jax=_cold_jax(lambda: _jax.jax_indices_from_named(sharding, SHAPE, devices)),
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
    return next((row for row in rows if (row["api"], row["devices"], row["spec"])
                 == (api, devices, spec)), None)


def notes(rows, processes) -> str:
    """The goals (≥20× at 4096 devices, linear in devices), measured, and where the time goes."""
    lines = ["**Goals.**"]
    unmet = False
    for spec in SPECS:
        row = _row(rows, "devices_indices_map", GOAL_DEVICES, spec)
        if row is not None:
            met = row["speedup"] >= GOAL_SPEEDUP
            unmet |= not met
            lines.append(f"- ≥{GOAL_SPEEDUP:.0f}× faster than JAX at {GOAL_DEVICES} devices, "
                         f"{spec}: {row['speedup']:.1f}×, {'met' if met else '**not met**'}.")
    for spec in SPECS:
        row = _row(rows, "indices_array", max(ABSTRACT_DEVICES), spec)
        if row is not None:
            met = row["speedup"] >= GOAL_SPEEDUP
            unmet |= not met
            lines.append(f"- The same bar for indices_array on {row['devices']} abstract "
                         f"devices, {spec}: {row['speedup']:.1f}×, "
                         f"{'met' if met else '**not met**'}.")
    lines.append("- Linear in devices: the slope of log µs against log devices, fitted from "
                 "64 devices up (1.0 is linear):")
    for api in ("devices_indices_map", "indices_array"):
        for spec in SPECS:
            points = [row for row in rows if row["api"] == api and row["spec"] == spec
                      and row["devices"] >= 64]
            if len(points) < 2:
                continue
            devices = [row["devices"] for row in points]
            slopes = {side: loglog_slope(devices, [row[f"{side}_us"] for row in points])
                      for side in ("ours", "jax")}
            lines.append(f"  - {api} {spec}: fastpjit {slopes['ours']:.2f}, "
                         f"JAX {slopes['jax']:.2f}.")
    big = [p for p in processes if p["devices"] > 8]
    if big:
        lines += ["", "**Many CPU devices are feasible:** " + "; ".join(
            f"{p['devices']} devices started in {p['startup_s']:.1f} s and peaked at "
            f"{p['max_rss_mib']:,} MiB" for p in big) + " (start-up counts from the script's "
            "start to JAX's device list, imports included), so every mesh here is made of real "
            "CPU devices; only the 32,768-position meshes are abstract."]
    if unmet:
        lines += ["", _where_the_time_goes(rows)]
    return "\n".join(lines)


def _where_the_time_goes(rows) -> str:
    """Why a goal is unmet, from profiles (`perf`) and prototypes taken at commit 2203351."""
    sharded = _row(rows, "devices_indices_map", GOAL_DEVICES, "P('x', 'y')")
    replicated = _row(rows, "devices_indices_map", GOAL_DEVICES, "P('y')")
    if sharded is None or replicated is None:
        return ""
    tiles = GOAL_DEVICES - MESHES[GOAL_DEVICES][1]
    per_tile_ns = (sharded["ours_us"] - replicated["ours_us"]) / tiles * 1e3
    return f"""\
**Where fastpjit's time goes** (shown while a goal is unmet; profiled with `perf annotate` and
prototyped in Python at commit 2203351):

- No function that returns a new `{{device: index}}` dict can be 20× faster than JAX at
  {GOAL_DEVICES} devices: building that dict from ready-made parts (the floor) takes
  {sharded['floor_us']:.0f} µs, so even a free index computation would be
  {sharded['jax_us'] / sharded['floor_us']:.1f}× faster than JAX. `P('y')` is at that floor
  already (overhead ratio {replicated['overhead_ratio']:.2f}).
- `P('x', 'y')` has a tile per device, and for each tile the bindings (`tile_indices` in
  `rust/bindings/src/index_maps.rs`) make two new `slice` objects and their four ints and a
  `Vec` for the tuple's items: about {per_tile_ns:.0f} ns per tile. JAX makes one slice per
  (dimension, shard) and shares it among tiles. Doing the same (the Σ partitions slices built
  once, one tuple per tile, the dict pre-sized) brings it to about the floor plus one tuple per
  tile; the pure-Python prototype `dict(zip(devices, itertools.product(slices_x, slices_y)))`
  already takes {PROTOTYPE_DICT_US} µs at 4096 devices, against {CURRENT_DICT_US} µs for the
  current code in the same process.
- `indices_array` with one tile per position (`P('x', 'y')`): the hot instructions follow
  integer divisions: `k / replicas` for every position in `IndexMap::new`, and the three
  divisions per dimension with which `IndexMap::tile_bounds` finds each position's
  coordinates again in `write_bounds`. With few tiles (`P('y')`) the time goes to the scatter
  in `IndexMap::new`, whose duplicate check loads `tiles[position]` in transposed, strided
  order. Counting (tile, replica) with nested loops, skipping the duplicate check for iota
  orders (permutations by construction), and copying each position's bounds from a per-tile
  table built once by an odometer would leave little above the floor: a NumPy prototype of
  the `P('x', 'y')` case does 32,768 positions in {PROTOTYPE_ARRAY_US} µs.
- So the way to ≥20× at 4096 devices is for fastpjit's own callers (shard_args, result
  handlers) to take per-position bounds like `indices_array`'s, made without Python objects,
  and to keep the dict for JAX compatibility only."""
