"""Transfers: `fastpjit.device_put` and `device_get` against `jax.device_put` and `np.asarray`

Host↔device copies of float32 arrays on 8 CPU devices, from 128 B to 256 MiB, each with three
shardings: `P('x')` on a 1-D mesh of 8 (row blocks), `P('x', 'y')` on a 2×4 mesh (2-D tiles,
strided in the host array) and `P()` (every device holds the whole array).

- **device_put** rows: ours is `fastpjit.device_put(x, s)`, JAX's `jax.device_put(x, s)`, both
  timed until ready (`.block_until_ready()` on the result), on the same host array. Its data
  start 16 bytes past a 64-byte boundary, where malloc puts large numpy arrays: jaxlib aliases
  64-byte-aligned dense shards instead of copying them, so an aligned input would time no copy
  at all. The results are checked equal in values, dtype, shape, aval, sharding and commitment.
  Freeing each result is timed, as in a `timeit` loop.
- **device_get** rows: ours is `fastpjit.device_get(a)`, JAX's `np.asarray(a)` (what
  `jax.device_get` calls after its tree handling, which JAX is thus spared). JAX keeps the
  numpy value in the array and builds its per-device arrays on first use, so every call reads a
  fresh `jax.Array`, on every side alike: each is made untimed before its call, by
  `jax.make_array_from_single_device_arrays` over device buffers made once per case, taken from
  pools refilled between calls, and freed untimed. The results are checked equal in values,
  dtype, shape and writeability (both are read-only), and equal to the host array.
- **host pool**: fastpjit keeps the host memory that freed results of large transfers give
  back (bounded, see the notes), so from the second call of a case on, its large puts and gets
  write memory already faulted in, where JAX's write memory new to the process.
- **floor**: one `np.copyto` of the array's bytes into an array already allocated and touched:
  memcpy speed, with no page faults. A `P()` put leaves a copy on each of the 8 devices, but on
  the CPU one copy that all 8 alias would do (JAX itself aliases aligned host arrays so), so its
  floor is one copy too. A `P()` get returns a read-only view of one device's buffer, copying
  nothing, so its floor is the one jaxlib call that makes that view
  (`_single_device_array_to_np_array_did_copy`), on a fresh array.

`python benches/run.py --quick` leaves out the 256 MiB puts (a `P()` one writes 2 GiB of new
device memory, seconds per call).
"""

from __future__ import annotations

import collections
import math
import statistics
import sys
import time

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import fastpjit
from fastpjit._jax.rust_handles import ARRAY_TO_HOST
from fastpjit.bench.harness import Call, Case, Plot, Sides

SHAPES = ((8, 4), (8, 1024), (8192, 1024), (65536, 1024))
SMALL = ((8, 4), (8, 1024))
SPECS = {"P('x')": ("8", P("x")), "P('x', 'y')": ("2x4", P("x", "y")), "P()": ("8", P())}
MESHES = {"8": ((8,), ("x",)), "2x4": ((2, 4), ("x", "y"))}
# Where the host arrays' data start, past a 64-byte boundary (see the docstring).
HOST_OFFSET = 16
# How many fresh arrays one pool refill makes: up to 256, and no more than 64 MiB of them.
POOL_BYTES = 64 << 20
# A smoke run leaves out the 256 MiB puts, whose calls take seconds (at least 26 per side).
QUICK = "--quick" in sys.argv

# The goals.
SMALL_SPEEDUP = 3.0
LARGE_FLOOR_RATIO = 1.5

COLUMNS = ("size", "mesh")
PLOT = Plot(
    file="transfer.png",
    x="bytes",
    series="spec",
    panel="op",
    title="Host↔device transfers of float32 arrays on 8 CPU devices (log-log)",
    xlabel="array bytes",
)


def _size(nbytes: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def _host(shape: tuple[int, ...], offset: int) -> np.ndarray:
    """A float32 array of distinct values whose data start `offset` bytes past 64-byte alignment."""
    nbytes = math.prod(shape) * 4
    buffer = np.empty(nbytes + 64, np.uint8)
    start = (offset - buffer.ctypes.data) % 64
    x = buffer[start : start + nbytes].view(np.float32).reshape(shape)
    x.reshape(-1)[:] = np.arange(x.size, dtype=np.float32)
    return x


def _sharding(spec_name: str) -> NamedSharding:
    mesh_name, spec = SPECS[spec_name]
    mesh_shape, axes = MESHES[mesh_name]
    return NamedSharding(Mesh(np.array(jax.devices()[:8]).reshape(mesh_shape), axes), spec)


def _memcpy(x: np.ndarray) -> Call:
    """The floor: a copy of `x`'s bytes into memory already touched."""
    out = np.zeros_like(x)
    return Call(lambda: np.copyto(out, x))


def _new_memory_gbps(x: np.ndarray) -> float:
    """GB/s of `x.copy()`, page faults of the new memory included (median of 5, not interleaved)."""
    times = []
    for _ in range(5):
        start = time.perf_counter()
        x.copy()
        times.append(time.perf_counter() - start)
    return x.nbytes / statistics.median(times) / 1e9


def _host_view(array) -> np.ndarray:
    """What fastpjit's device_get returns for a fully replicated array: a host view of its
    first shard, by the method that `ARRAY_TO_HOST` names."""
    return getattr(array, ARRAY_TO_HOST)()[0]


def _same_put(ours, theirs) -> None:
    assert isinstance(ours, jax.Array), f"{type(ours).__name__} is not a jax.Array"
    assert ours.shape == theirs.shape, f"shape {ours.shape} != {theirs.shape}"
    assert ours.dtype == theirs.dtype, f"dtype {ours.dtype} != {theirs.dtype}"
    assert ours.aval == theirs.aval, f"aval {ours.aval} != {theirs.aval}"
    assert ours.sharding == theirs.sharding, f"sharding {ours.sharding} != {theirs.sharding}"
    assert ours.committed == theirs.committed, "commitment differs"
    assert np.array_equal(np.asarray(ours), np.asarray(theirs)), "values differ"


def _same_get(ours, theirs) -> None:
    assert isinstance(ours, np.ndarray), f"{type(ours).__name__} is not a numpy array"
    assert ours.shape == theirs.shape, f"shape {ours.shape} != {theirs.shape}"
    assert ours.dtype == theirs.dtype, f"dtype {ours.dtype} != {theirs.dtype}"
    assert ours.flags.writeable == theirs.flags.writeable, "writeability differs"
    assert np.array_equal(ours, theirs), "values differ"


def _put(x: np.ndarray, sharding: NamedSharding) -> Sides:
    return Sides(
        ours=lambda: fastpjit.device_put(x, sharding).block_until_ready(),
        jax=lambda: jax.device_put(x, sharding).block_until_ready(),
        floor=_memcpy(x),
        check=_same_put,
    )


class FreshArrays:
    """A new jax.Array per call, over device buffers made once: none has a cached value.

    `setup` (untimed) takes the next array from a pool, refilled when empty, and `call` hands
    it to a timed function. The array stays referenced until the next setup, so that freeing it
    (and the numpy value that JAX caches in it) is left out of the time.
    """

    def __init__(self, host: np.ndarray, sharding: NamedSharding) -> None:
        singles, shards = [], {}
        for device, index in sharding.addressable_devices_indices_map(host.shape).items():
            key = tuple(s.indices(n) for s, n in zip(index, host.shape, strict=True))
            if key not in shards:
                # Aligned and dense, so jaxlib aliases it rather than copying: pools of fresh
                # 256 MiB arrays, replicated ones included, hold 256 MiB in all.
                shards[key] = _host(host[index].shape, 0)
                np.copyto(shards[key], host[index])
            singles.append(jax.device_put(shards[key], device))
        self._make = lambda: jax.make_array_from_single_device_arrays(host.shape, sharding, singles)
        self._refill = max(1, min(256, POOL_BYTES // host.nbytes))
        self._pool: collections.deque = collections.deque()
        self.current = None

    def setup(self) -> None:
        self.current = None
        if not self._pool:
            self._pool.extend(self._make() for _ in range(self._refill))
        self.current = self._pool.popleft()

    def call(self, fn) -> Call:
        return Call(lambda: fn(self.current), setup=self.setup)


def _get(host: np.ndarray, sharding: NamedSharding) -> Sides:
    fresh = FreshArrays(host, sharding)

    def check(ours, theirs):
        _same_get(ours, theirs)
        assert np.array_equal(ours, host), "values differ from the host array put"

    return Sides(
        ours=fresh.call(fastpjit.device_get),
        jax=fresh.call(np.asarray),
        # The memcpy reads no jax.Array, so it takes none from the pool (at well under a µs a
        # call for small arrays, it would take millions).
        floor=fresh.call(_host_view) if sharding.is_fully_replicated else _memcpy(host),
        check=check,
    )


def _build(op: str, shape: tuple[int, ...], spec_name: str) -> Sides:
    host = _host(shape, HOST_OFFSET)
    sides = (_put if op == "device_put" else _get)(host, _sharding(spec_name))
    if shape not in SMALL:
        sides.meta["new_memory_gbps"] = _new_memory_gbps(host)
    return sides


def _case(op: str, shape: tuple[int, ...], spec_name: str) -> Case:
    nbytes = math.prod(shape) * 4
    return Case(
        name=f"{op} {shape} {spec_name}",
        build=lambda: _build(op, shape, spec_name),
        devices=8,
        meta={
            "op": op,
            "shape": list(shape),
            "bytes": nbytes,
            "size": _size(nbytes),
            "mesh": SPECS[spec_name][0],
            "spec": spec_name,
        },
    )


CASES = [
    _case(op, shape, spec)
    for op in ("device_put", "device_get")
    for shape in SHAPES
    for spec in SPECS
    if not (QUICK and op == "device_put" and shape == SHAPES[-1])
]


# Where the time goes: pieces timed once at commit 018a21d (native build 885545802d76), on
# fresh arrays where they read one, interleaved, median of 11 rounds of 2,000 calls (5 rounds
# of 1 call at 256 MiB), in µs, with load average about 2.
PIECES = {
    # Timed at commit 6009f71, (8, 4) float32 on 8 devices, unaligned as in the rows: puts
    # until ready (P('x'), then P()), and gets of fresh arrays, P('x').
    "put_raw": 15.0,
    "put_ours": 17.7,
    "put_jax": 42.2,
    "put_p_raw": 12.0,
    "put_p_ours": 13.7,
    "put_p_jax": 36.2,
    "get_arrays": 12.5,
    "get_ours": 18.9,
}


def _gbps(row, side: str) -> float:
    return row["bytes"] / (row[f"{side}_us"] * 1e3)


def _is_view(row) -> bool:
    return row["op"] == "device_get" and row["spec"] == "P()"


def notes(rows, processes) -> str:
    """The goals (≥3× JAX when small, ≤1.5× the floor when large), bandwidths, and why."""
    lines = ["**Goals.**"]
    small = [row for row in rows if tuple(row["shape"]) in SMALL]
    large = [row for row in rows if tuple(row["shape"]) not in SMALL]
    unmet = False
    if small:
        missed = [row for row in small if row["speedup"] < SMALL_SPEEDUP]
        unmet |= bool(missed)
        lines.append(
            f"- ≥{SMALL_SPEEDUP:.0f}× faster than JAX for the small shapes: met in "
            f"{len(small) - len(missed)} of {len(small)} rows"
            + (
                "; **not met** in "
                + ", ".join(f"{row['name']} ({row['speedup']:.1f}×)" for row in missed)
                if missed
                else ""
            )
            + "."
        )
    copies = [row for row in large if not _is_view(row)]
    if copies:
        missed = [row for row in copies if row["ours_us"] > LARGE_FLOOR_RATIO * row["floor_us"]]
        unmet |= bool(missed)
        lines.append(
            f"- Within {LARGE_FLOOR_RATIO}× of the memcpy floor for the large shapes: "
            f"met in {len(copies) - len(missed)} of {len(copies)} rows"
            + (
                "; **not met** in "
                + ", ".join(
                    f"{row['name']} ({row['ours_us'] / row['floor_us']:.1f}×)" for row in missed
                )
                if missed
                else ""
            )
            + "."
        )
    views = [row for row in large if _is_view(row)]
    if views:
        lines.append(
            "- Large `P()` gets copy nothing; against their floor (the view), "
            "fastpjit takes "
            + ", ".join(f"{row['ours_us'] / row['floor_us']:.1f}× ({row['size']})" for row in views)
            + ", JAX "
            + ", ".join(f"{row['jax_us'] / row['floor_us']:.1f}×" for row in views)
            + "."
        )
    if copies:
        lines += [
            "",
            "**Bandwidth of the large shapes**, in GB/s (10⁹ bytes a second) of the array's "
            "bytes, though a `P()` put writes 8 times as many. *new memory* is `x.copy()`, "
            "measured apart (median of 5, not interleaved): a copy into memory just allocated, "
            "whose page faults every put and get also pays (numpy asks for huge pages for "
            "arrays of 4 MiB and more).",
            "",
            "| case | fastpjit GB/s | JAX GB/s | floor (memcpy) GB/s | new memory GB/s | "
            "fastpjit / floor |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for row in copies:
            lines.append(
                f"| {row['name']} | {_gbps(row, 'ours'):.2f} | "
                f"{_gbps(row, 'jax'):.2f} | {_gbps(row, 'floor'):.2f} | "
                f"{row['new_memory_gbps']:.2f} | "
                f"{row['ours_us'] / row['floor_us']:.2f}× |"
            )
    if unmet:
        lines += ["", _where_the_time_goes(rows)]
    return "\n".join(lines)


def _where_the_time_goes(rows) -> str:
    """Why the goals are unmet, from the pieces in PIECES (timed once) and `perf`."""
    p = PIECES
    big_get = next(
        (
            row
            for row in rows
            if row["op"] == "device_get"
            and tuple(row["shape"]) == SHAPES[-1]
            and row["spec"] == "P('x')"
        ),
        None,
    )
    new_memory = ""
    if big_get is not None:
        new_memory_us = big_get["bytes"] / big_get["new_memory_gbps"] / 1e3
        new_memory = (
            f" For 256 MiB, `P('x')`, a get took {big_get['ours_us'] / 1e3:.1f} ms for fastpjit "
            f"and {big_get['jax_us'] / 1e3:.1f} for JAX, against "
            f"{big_get['floor_us'] / 1e3:.1f} for the memcpy and {new_memory_us / 1e3:.1f} for a "
            f"copy into new memory."
        )
    return f"""\
**Where fastpjit's time goes** (shown while a goal is unmet; pieces timed once at commit
6009f71, (8, 4) float32, in µs; the rows above may differ, the machine being shared):

- **Small puts are at jaxlib's own call.** fastpjit makes one `batched_device_put` with the
  shards already sliced, and that call alone, until ready, costs {p["put_raw"]} µs for
  `P('x')` ({p["put_p_raw"]} for `P()`), against {p["put_ours"]} ({p["put_p_ours"]}) for
  `fastpjit.device_put` and {p["put_jax"]} ({p["put_p_jax"]}) for `jax.device_put`. So no
  caller of that call can be more than {p["put_jax"] / p["put_raw"]:.1f}×
  ({p["put_p_jax"] / p["put_p_raw"]:.1f}×) faster than JAX here: its cost is per shard
  (about 1.8 µs each, 3 µs for one), whatever the host buffer semantics or alignment. ≥3×
  needs a cheaper way into jaxlib than `batched_device_put`, not a faster wrapper.
- **Small gets pay for jaxlib's per-device arrays.** A fresh sharded array has no
  single-device arrays yet, and `_arrays`, which builds all of them in one call, alone takes
  {p["get_arrays"]} µs of fastpjit's {p["get_ours"]}; the shards are then read through the
  buffer protocol and copied in Rust. ≥3× needs a way into shard memory that jaxlib does not
  give Python.
- **Large transfers reuse host memory.** Memory just allocated must be faulted in and zeroed
  by the kernel as it is first written (the *new memory* column), which costs about as much
  as the copy. fastpjit takes the result of a large get, and the buffers that a large put
  stages each tile in (jaxlib adopts those on the CPU without copying again), from a bounded
  pool of host memory that earlier results gave back when freed (1 GiB idle at most by
  default, `fastpjit.set_host_pool_limit`), and copies with `available_parallelism()`
  threads (2 here). A loop that frees its results thus copies into memory already faulted
  in, as the memcpy floor does; the first transfer of a size, and any made while earlier
  results stay alive, pay the page faults.{new_memory}"""
