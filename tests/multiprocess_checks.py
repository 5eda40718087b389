"""The checks of fastpjit against JAX that need two processes; run by `test_multiprocess.py` as

    python -m fastpjit.launch --nproc 2 --local-devices 4 tests/multiprocess_checks.py

Each process joins the other through a plain `jax.distributed.initialize()` (the launcher's
environment, found once fastpjit is imported), runs every check in the same order, and prints
`CHECK <name> ok`, or `CHECK <name> FAILED` and the traceback. A failed check does not stop the
others, so each must leave both processes at the same point (each runs its collectives before
it asserts anything).
"""

from __future__ import annotations

import os
import sys
import tempfile
import traceback
from collections.abc import Callable

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax._src.sharding_impls import device_replica_id_map
from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P
from oracle import assert_same_array, assert_same_outputs

import fastpjit

NUM_PROCESSES = 2
LOCAL_DEVICES = 4
CHECKS: list[Callable[[], None]] = []


def check(fn: Callable[[], None]) -> Callable[[], None]:
    CHECKS.append(fn)
    return fn


def devices():
    return jax.devices()


def mesh_2x4():
    return Mesh(np.array(devices()).reshape(2, 4), ("x", "y"))


def mesh_8():
    return Mesh(np.array(devices()), ("x",))


def by_process():
    """The devices with the two processes interleaved: 0 of process 0, 0 of process 1, ..."""
    return sorted(devices(), key=lambda d: (d.id % LOCAL_DEVICES, d.process_index))


# --- Index maps ----------------------------------------------------------------------------


def check_index_maps(sharding, shape, local_devices):
    ours = fastpjit.devices_indices_map(sharding, shape)
    assert ours == sharding.devices_indices_map(shape), sharding
    assert list(ours) == list(sharding.devices_indices_map(shape)), sharding
    assert set(ours) == set(sharding.device_set)

    ours_local = fastpjit.addressable_devices_indices_map(sharding, shape)
    assert ours_local == sharding.addressable_devices_indices_map(shape), sharding
    assert set(ours_local) == set(ours) & set(local_devices), sharding
    assert all(d.process_index == jax.process_index() for d in ours_local)

    assert fastpjit.shard_shape(sharding, shape) == sharding.shard_shape(shape)
    assert fastpjit.device_replica_id_map(sharding, shape) == device_replica_id_map(sharding, shape)
    expected = [
        [[s.start or 0, n if s.stop is None else s.stop] for s, n in zip(index, shape, strict=True)]
        for index in (ours[d] for d in sharding._device_assignment)
    ]
    np.testing.assert_array_equal(
        fastpjit.indices_array(sharding, shape),
        np.array(expected, dtype=np.int64).reshape(len(expected), len(shape), 2),
    )


@check
def index_maps():
    process_id = jax.process_index()
    local = jax.local_devices()
    mesh = mesh_2x4()
    interleaved = Mesh(np.array(by_process()).reshape(2, 2, 2), ("a", "b", "c"))
    made = jax.make_mesh((4, 2), ("x", "y"))
    remote = [d for d in devices() if d.process_index != process_id]
    remote_only = Mesh(np.array(remote).reshape(2, 2), ("x", "y"))
    cases = [
        (NamedSharding(mesh, P("x", "y")), (8, 8)),
        (NamedSharding(mesh, P("y", "x")), (8, 4)),
        (NamedSharding(mesh, P(("x", "y"))), (16, 3)),
        (NamedSharding(mesh, P(None, "y")), (2, 4)),
        (NamedSharding(mesh, P()), (5, 3)),
        (NamedSharding(mesh, P()), ()),
        (NamedSharding(interleaved, P("c", ("b", "a"))), (2, 8)),
        (NamedSharding(interleaved, P("b")), (6,)),
        (NamedSharding(made, P("y", "x")), (4, 8)),
        (NamedSharding(remote_only, P("x")), (4, 4)),
        (SingleDeviceSharding(remote[0]), (3, 3)),
        (SingleDeviceSharding(local[-1]), (3, 3)),
        (
            fastpjit.parse_hlo_sharding(
                "{devices=[2,1,4]<=[8] last_tile_dim_replicate}", devices()
            ),
            (4, 6),
        ),
        (fastpjit.parse_hlo_sharding("{devices=[4,2]<=[2,4]T(1,0)}", by_process()), (8, 2)),
    ]
    for sharding, shape in cases:
        check_index_maps(sharding, shape, local)
    assert set(fastpjit.addressable_devices_indices_map(cases[0][0], (8, 8))) == set(local)
    assert fastpjit.addressable_devices_indices_map(cases[9][0], (4, 4)) == {}


# --- jit, device_put and pmap across the processes -----------------------------------------


def global_array(sharding, shape):
    host = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    return host, jax.make_array_from_callback(shape, sharding, lambda index: host[index])


@check
def jit_over_a_global_mesh():
    """fastpjit's compile, then its Rust fast path, across both processes, collectives
    included; each call's outputs equal jax.jit's."""
    mesh = mesh_2x4()
    _, x = global_array(NamedSharding(mesh, P("x", "y")), (8, 8))
    replicated = NamedSharding(mesh, P())

    def step(a, b):
        # An elementwise update, a transpose, a reduction over every device of both processes
        # and a matmul whose result XLA shards.
        return a * 2 + b, a.T, jnp.sum(a, axis=0), a @ a.T

    ours = fastpjit.jit(step)
    theirs = jax.jit(step)
    reduced_ours = fastpjit.jit(lambda a: a.sum(), out_shardings=replicated)
    reduced_theirs = jax.jit(lambda a: a.sum(), out_shardings=replicated)
    before = fastpjit.stats()
    results = []
    for _ in range(3):  # a miss, then hits
        results.append((ours(x, 1.5), theirs(x, 1.5), reduced_ours(x), reduced_theirs(x)))
    after = fastpjit.stats()
    for mine, expected, total, expected_total in results:
        assert_same_outputs(mine, expected)
        assert_same_array(total, expected_total)
        assert float(total) == float(np.arange(64).sum())
    assert after["cache_hits"] - before["cache_hits"] == 4, (before, after)
    assert after["compiles"] - before["compiles"] == 2, (before, after)
    assert after["fallbacks"] == before["fallbacks"], after["fallbacks"]


@check
def device_put_across_processes():
    host = np.arange(64, dtype=np.float32).reshape(8, 8)
    # On `columns`, each process holds two columns of the mesh, so that along y its four
    # devices hold two tiles, each twice.
    columns = Mesh(np.array(by_process()).reshape(4, 2).T, ("x", "y"))
    for mesh in (mesh_2x4(), columns):
        for spec in (P("x", "y"), P(), P("y"), P(None, "y"), P(None, ("x", "y"))):
            sharding = NamedSharding(mesh, spec)
            unaligned = np.arange(65, dtype=np.float32)[1:].reshape(8, 8)
            for value in (host, unaligned, host.T):
                assert_same_array(
                    fastpjit.device_put(value, sharding), jax.device_put(value, sharding)
                )


def hits_only(call: Callable[[], object]) -> object:
    """Runs `call` (a second call of one signature): it must be a hit, with no fallback."""
    before = fastpjit.stats()
    out = call()
    after = fastpjit.stats()
    assert after["cache_hits"] == before["cache_hits"] + 1, "not a cache hit"
    assert after["cache_misses"] == before["cache_misses"], "a cache miss"
    assert after["fallbacks"] == before["fallbacks"], after["fallbacks"]
    return out


def pmap_across_processes(fun, *args, repeats=3, **options):
    """`fastpjit.pmap` against `jax.pmap` on host-local arguments: the same outputs on every
    call, and every call after the first a hit with no fallback."""
    ours, theirs = fastpjit.pmap(fun, **options), jax.pmap(fun, **options)
    for i in range(repeats):
        expected = theirs(*args)
        got = ours(*args) if i == 0 else hits_only(lambda: ours(*args))
        assert_same_outputs(got, expected)


def host_rows(*shape):
    return local_values((LOCAL_DEVICES, *shape))


@check
def pmap_of_host_local_rows():
    pmap_across_processes(lambda v: v * 3 + jax.process_index(), host_rows(3))
    # Arrays that a previous pmap left on this process's devices.
    placed = jax.pmap(lambda v: v + 0)(host_rows(3))
    pmap_across_processes(lambda v: v * 3, placed)


@check
def pmap_collectives_across_processes():
    x = host_rows(2)
    pmap_across_processes(lambda v: v / jax.lax.psum(v, "i"), x, axis_name="i")
    pmap_across_processes(lambda v: jax.lax.pmean(v, "i"), x, axis_name="i")
    pmap_across_processes(lambda v: jax.lax.all_gather(v, "i"), x, axis_name="i")
    pmap_across_processes(lambda v: (jax.lax.psum(v, "i"), v.sum()), x, axis_name="i")


@check
def pmap_axes_statics_and_scalars_across_processes():
    x, y = host_rows(3), local_values((3, LOCAL_DEVICES))
    pmap_across_processes(lambda a, b: a + b.T, x, y, in_axes=(0, 1))
    pmap_across_processes(lambda a: a * 2, x, out_axes=1)
    pmap_across_processes(lambda a, s: a * 2.5 + s, x, 1.5, in_axes=(0, None))
    pmap_across_processes(lambda a, n: a * n, x, 3, static_broadcasted_argnums=1)
    pmap_across_processes(lambda a, b: a - b, x, np.float32(2), in_axes=(0, None))


@check
def pmap_donation_across_processes():
    step = lambda state, batch: state * 0.5 + batch  # noqa: E731
    ours = fastpjit.pmap(step, donate_argnums=0)
    theirs = jax.pmap(step, donate_argnums=0)
    prepare = jax.pmap(lambda v: v + 0)
    batch = host_rows(3)
    o, t = prepare(host_rows(3)), prepare(host_rows(3))
    for i in range(4):
        previous = o
        o = ours(o, batch) if i == 0 else hits_only(lambda o=o: ours(o, batch))
        t = theirs(t, batch)
        assert_same_outputs(o, t)
        assert previous.is_deleted()


# --- make_array_from_process_local_data against JAX's ---------------------------------------


def local_values(shape, dtype=np.float32):
    """Values that differ between the processes and between the elements."""
    base = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    return (base + 1000 * jax.process_index()).astype(dtype)


def outcome(make, sharding, data, global_shape):
    try:
        return make(sharding, data, global_shape)
    except Exception as e:  # compared below: same type as JAX's
        return e


def compare_with_jax(sharding, data, global_shape=None, *, fallbacks=0):
    """Both functions on the same input: equal arrays, or the same exception type."""
    before = sum(fastpjit.stats()["fallbacks"].values())
    theirs = outcome(jax.make_array_from_process_local_data, sharding, data, global_shape)
    ours = outcome(fastpjit.make_array_from_process_local_data, sharding, data, global_shape)
    counted = sum(fastpjit.stats()["fallbacks"].values()) - before
    case = (sharding, getattr(data, "shape", type(data)), global_shape)
    if isinstance(theirs, Exception):
        assert type(ours) is type(theirs), (case, ours, theirs)
        return ours
    assert not isinstance(ours, Exception), (case, ours)
    assert_same_outputs(ours, theirs)
    assert counted == fallbacks, (case, fastpjit.stats()["fallbacks"])
    return ours


@check
def make_array_1d_mesh():
    mesh = mesh_8()
    interleaved = Mesh(np.array(by_process()), ("x",))
    for m in (mesh, interleaved):
        for spec, local_shape, global_shape in [
            (P("x"), (4,), None),  # four rows a process, eight in all
            (P("x"), (8,), None),
            (P("x"), (4, 3), None),
            (P(None, "x"), (3, 4), None),
            (P(None, "x"), (3, 12), None),
            (P(), (5,), None),  # replicated: every process passes the same value
            (P("x"), (16,), (16,)),  # every process passes the whole array
            (P("x"), (8, 2), (16, 2)),
            (P("x"), (8, 2), (8, 2)),
        ]:
            data = local_values(local_shape)
            if spec == P() or global_shape == local_shape:
                data = np.arange(int(np.prod(local_shape)), dtype=np.float32).reshape(local_shape)
            compare_with_jax(NamedSharding(m, spec), data, global_shape)


@check
def make_array_2d_mesh():
    mesh = mesh_2x4()
    # Process 0 on the mesh's first column pair and process 1 on the second: both split y.
    columns = Mesh(np.array(by_process()).reshape(4, 2).T, ("x", "y"))
    for m in (mesh, columns):
        for spec, local_shape, global_shape in [
            (P("x", "y"), (4, 8), None),
            (P("x", "y"), (2, 4), None),
            (P("y", "x"), (8, 4), None),
            (P("x"), (4, 8), None),
            (P(None, "y"), (4, 8), None),
            (P(None, "x"), (4, 4), None),
            (P(("x", "y")), (8, 2), None),
            (P(("y", "x")), (8, 2), None),
            (P("x", "y"), (4, 8), (8, 8)),
            (P("x", "y"), (8, 8), (8, 8)),  # the whole array, given by each process
            (P("x", "y"), (8, 4), (8, 8)),
            (P("x", "y"), (4, 4), (8, 4)),
            (P(), (3, 5), None),
        ]:
            data = local_values(local_shape)
            if spec == P() or global_shape == local_shape:
                data = np.arange(int(np.prod(local_shape)), dtype=np.float32).reshape(local_shape)
            compare_with_jax(NamedSharding(m, spec), data, global_shape)
    # A GSPMD sharding, which the index maps read from its HLO text.
    gspmd = fastpjit.parse_hlo_sharding("{devices=[2,4]<=[8]}", devices())
    compare_with_jax(gspmd, local_values((4, 8)))


@check
def make_array_dtypes_and_layouts():
    sharding = NamedSharding(mesh_2x4(), P("x", "y"))
    for dtype in (
        np.float64,
        np.int64,
        np.int8,
        np.uint16,
        np.bool_,
        np.complex64,
        ml_dtypes.bfloat16,
    ):
        compare_with_jax(sharding, local_values((4, 8), dtype))
    base = local_values((8, 4))
    compare_with_jax(sharding, base.T)  # not C-ordered
    compare_with_jax(sharding, local_values((8, 16))[::2, ::2])  # strided
    # Large enough that fastpjit stages the tiles in buffers of its own; and aligned and dense
    # enough that jaxlib adopts them.
    compare_with_jax(sharding, local_values((1024, 512)))
    compare_with_jax(NamedSharding(mesh_2x4(), P("x")), local_values((512, 1024)))
    compare_with_jax(NamedSharding(mesh_2x4(), P()), np.float32(2.5))
    # A pytree of leaves with one sharding.
    tree = {"a": local_values((4, 8)), "b": [local_values((4, 16), np.int32)]}
    ours = compare_with_jax(sharding, tree)
    assert jax.tree.structure(ours) == jax.tree.structure(tree)


@check
def make_array_bad_input():
    mesh = mesh_2x4()
    sharding = NamedSharding(mesh, P("x", "y"))
    # A local extent that is neither the global one nor this process's share.
    for local_shape, global_shape in [
        ((3, 8), (8, 8)),
        ((4, 8), (8, 16)),
        ((4, 6), (8, 8)),
        ((4, 8), (8, None)),
        ((4, 8), (8, 8, 1)),
        ((4, 6), None),
    ]:  # 6 columns over 4 devices
        error = compare_with_jax(sharding, local_values(local_shape), global_shape)
        assert isinstance(error, ValueError), (local_shape, global_shape, error)
    # Devices of the two processes mixed so that they hold overlapping but unequal sets of
    # columns: no global shape follows from the local one.
    d = devices()
    mixed = Mesh(
        np.array([d[0], d[1], d[2], d[4], d[5], d[3], d[6], d[7]]).reshape(2, 4), ("x", "y")
    )
    error = compare_with_jax(NamedSharding(mixed, P("x", "y")), local_values((4, 6)))
    assert isinstance(error, ValueError) and "non-uniform" in str(error), error


@check
def make_array_counts_what_jax_does():
    sharding = NamedSharding(mesh_2x4(), P("x", "y"))
    fastpjit.reset_stats()
    fastpjit.make_array_from_process_local_data(sharding, local_values((4, 8)))
    assert fastpjit.stats()["fallbacks"] == {}
    # A process-local jax.Array as the local data is JAX's to place.
    local = jax.device_put(local_values((4, 8)), jax.local_devices()[0])
    compare_with_jax(sharding, local, fallbacks=1)
    assert list(fastpjit.stats()["fallbacks"]) == ["process_local.not_numpy"]


# --- Serving and warm starts across the processes ------------------------------------------


@check
def bound_function_across_processes():
    """A function with global weights bound: the bound path on every call after the first,
    with jax.jit's outputs."""
    mesh = mesh_2x4()
    _, w = global_array(NamedSharding(mesh, P("x", "y")), (8, 8))
    _, x = global_array(NamedSharding(mesh, P("x")), (8, 8))

    def step(w, x):
        return jnp.tanh(x @ w), jnp.sum(w)

    g = fastpjit.jit(step).bind(w)
    expected = jax.jit(step)(w, x)
    assert_same_outputs(g(x), expected)
    for _ in range(2):
        assert_same_outputs(hits_only(lambda: g(x)), expected)
    report = fastpjit.explain(g, x)
    assert (report.outcome, report.path) == ("hit", "bound"), report


@check
def warm_up_across_processes():
    """A signature recorded in one run is compiled by `warm_up` in the next (here, another
    function of the same code): its first call is a hit, with jax.jit's outputs."""
    mesh = mesh_2x4()
    _, x = global_array(NamedSharding(mesh, P("x", "y")), (8, 8))

    def scaled_total(a):
        return a * 3, jnp.sum(a)

    fastpjit.jit(scaled_total)(x)
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, f"signatures-{jax.process_index()}.json")
        fastpjit.save_signatures(path, {"scaled_total": fastpjit.jit(scaled_total)})
        fastpjit.jit(scaled_total).clear_cache()
        fresh = fastpjit.jit(scaled_total)
        report = fastpjit.warm_up(path, {"scaled_total": fresh}, threads=1)
    assert report.counts() == {"compiled": 1}, str(report)
    assert_same_outputs(hits_only(lambda: fresh(x)), jax.jit(scaled_total)(x))


@check
def stats_across_processes():
    """Each process counts its own calls: a miss that compiled, then hits, in one row."""
    mesh = mesh_2x4()
    _, x = global_array(NamedSharding(mesh, P("x", "y")), (8, 8))

    def counted_step(a):
        return a - 1

    f = fastpjit.jit(counted_step)
    for _ in range(3):
        f(x)
    rows = [
        counts
        for name, counts in fastpjit.stats()["functions"].items()
        if name.endswith(".counted_step")
    ]
    assert len(rows) == 1, fastpjit.stats()["functions"]
    (counts,) = rows
    assert (counts["calls"], counts["cache_hits"], counts["cache_misses"]) == (3, 2, 1), counts
    assert counts["compiles"] == 1 and counts["fallbacks"] == {}, counts


# --- The same global computation as one process runs it -----------------------------------


def global_results() -> dict[str, np.ndarray]:
    """A jit over a 2×4 mesh and a pmap with a psum, on the same global data in any number of
    processes (each passes the part that its devices hold), gathered whole to the host: one
    process with 8 devices computes the same values (integers, exact in float32)."""
    from jax.experimental import multihost_utils

    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("x", "y"))
    _, x = global_array(NamedSharding(mesh, P("x", "y")), (8, 8))
    outs = fastpjit.jit(lambda a, b: (a * 2 + b, a.T, jnp.sum(a, axis=0), a @ a.T))(x, 1.5)
    rows = np.arange(24, dtype=np.float32).reshape(8, 3)
    local = jax.local_device_count()
    mine = rows[jax.process_index() * local : (jax.process_index() + 1) * local]
    summed = fastpjit.pmap(lambda v: v + jax.lax.psum(v, "i"), axis_name="i")(mine)
    gathered = [multihost_utils.process_allgather(out, tiled=True) for out in outs]
    gathered.append(multihost_utils.process_allgather(summed, tiled=True))
    names = ("jit elementwise", "jit transpose", "jit column sums", "jit matmul", "pmap psum")
    return {name: np.asarray(value) for name, value in zip(names, gathered, strict=True)}


@check
def results_as_one_process_computes_them():
    """Prints each global result's digest, which the tests compare with one process's."""
    for name, value in global_results().items():
        print(f"RESULT {name.replace(' ', '_')} {digest(value)}", flush=True)


def digest(value: np.ndarray) -> str:
    import hashlib

    shape = "x".join(map(str, value.shape))
    return f"{value.dtype}-{shape}-{hashlib.sha256(value.tobytes()).hexdigest()[:16]}"


def main() -> int:
    jax.distributed.initialize()
    assert jax.process_count() == NUM_PROCESSES, jax.process_count()
    assert jax.local_device_count() == LOCAL_DEVICES, jax.local_devices()
    assert jax.device_count() == NUM_PROCESSES * LOCAL_DEVICES, jax.devices()
    failed = 0
    for fn in CHECKS:
        try:
            fn()
            print(f"CHECK {fn.__name__} ok", flush=True)
        except BaseException:  # a pyo3 PanicException derives from BaseException
            failed += 1
            print(f"CHECK {fn.__name__} FAILED", flush=True)
            traceback.print_exc(file=sys.stdout)
            sys.stdout.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
