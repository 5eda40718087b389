"""fastpjit demo on 8 CPU devices: pmap and pjit next to JAX's, index maps, and latencies
measured as `fastpjit.benchmark` measures them.

Run with `make demo`.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import warnings  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import fastpjit  # noqa: E402
from fastpjit.bench import Settings, harness, measure_call  # noqa: E402
from fastpjit.bench.harness import Sides, same_result  # noqa: E402


def show_index(index):
    return "(" + ", ".join(":" if s.start is None else f"{s.start}:{s.stop}" for s in index) + ")"


def same(ours, theirs):
    leaves = zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True)
    return all(
        a.sharding == b.sharding and a.dtype == b.dtype and np.array_equal(a, b) for a, b in leaves
    )


SETTINGS = Settings(rounds=15, round_s=0.01)


def sgd(params, x, lr):
    return jax.tree.map(lambda p: p - lr * jnp.sum(x), params)


def serve(params, x):
    return jnp.tanh(x) * sum(p.sum() for p in jax.tree.leaves(params))


def latency_cases(mesh, x):
    """(title, function, arguments): each function is timed under fastpjit.jit (or pmap, or
    bound), jax.jit, and the floor."""
    one = jnp.ones(4)
    sharded = jax.device_put(x, NamedSharding(mesh, P("x")))
    stacked = jax.pmap(lambda v: v)(x)
    tree = {f"layer{i:04d}": jnp.full(4, i, jnp.float32) for i in range(1000)}
    weights = jax.device_put({f"layer{i:03d}": np.full((4,), i, np.float32) for i in range(100)})
    return [
        ("jit f(x), 1 device", lambda v: v + 1, (one,)),
        ("jit f(x, 2.0): a Python scalar", lambda v, s: v * s, (one, 2.0)),
        ("jit f(params, x, 0.1): 1000-leaf parameter tree", sgd, (tree, one, 0.1)),
        ("pmap f(x), 8 devices", fastpjit.pmap(lambda v: v + 1), (stacked,)),
        (
            "bound serving call g(x), g = jit(step).bind(100 weights)",
            fastpjit.jit(serve).bind(weights),
            (one,),
        ),
        ("jit f(x), 8 devices, P('x')", lambda v: v + 1, (sharded,)),
    ]


def main():
    devices = jax.devices()
    print(f"fastpjit {fastpjit.__version__} on {len(devices)} {devices[0].platform} devices\n")
    x = np.arange(32, dtype=np.float32).reshape(8, 4)

    # pmap: the classic normalisation over a named axis.
    def normalise(v):
        return v / jax.lax.psum(v, "i")

    ours, theirs = fastpjit.pmap(normalise, "i")(x), jax.pmap(normalise, "i")(x)
    print(
        "pmap(x / psum(x, 'i')) on an (8, 4) array:",
        "same as JAX" if same(ours, theirs) else "DIFFERENT FROM JAX",
    )
    print("  row sums:", np.asarray(ours).sum(axis=0))

    # pjit, 2022 style: the old keywords and the old mesh context manager.
    mesh = Mesh(np.array(devices).reshape(2, 4), ("x", "y"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with mesh:
            out = fastpjit.pjit(
                lambda v: v * 2, in_axis_resources=None, out_axis_resources=P("x", "y")
            )(x)
    print("\npjit(..., out_axis_resources=P('x', 'y')) under `with mesh:`:")
    for shard in out.addressable_shards[:4]:
        print(f"  device {shard.device.id}: {show_index(shard.index)}")
    print("  ...")

    # Index maps computed in Rust, equal to JAX's.
    sharding = NamedSharding(mesh, P(("y", "x")))
    assert fastpjit.devices_indices_map(sharding, (8, 4)) == sharding.devices_indices_map((8, 4))
    print("\ndevices_indices_map of P(('y', 'x')) on (8, 4): same as JAX")

    # Latency: fastpjit, JAX and the floor (the executable run raw) on the same calls, timed
    # by the harness of `fastpjit.benchmark`: interleaved rounds, each call's results waited
    # for, medians with their spread.
    print(f"\nµs per call on {harness.describe(harness.environment())}")
    print(
        "(median of 15 interleaved rounds, results checked equal first; speedup = JAX / "
        "fastpjit;\n overhead = (fastpjit - floor) / (JAX - floor); spread = the rounds' "
        "interquartile range / median)\n"
    )
    rows = [
        measure_call(fn, args, {}, SETTINGS, name=title).row
        for title, fn, args in latency_cases(mesh, x)
    ]
    put, copied = NamedSharding(mesh, P("x")), np.zeros_like(x)
    rows.append(
        harness.measure(
            "device_put of an (8, 4) numpy array, P('x')",
            Sides(
                ours=lambda: fastpjit.device_put(x, put).block_until_ready(),
                jax=lambda: jax.device_put(x, put).block_until_ready(),
                floor=lambda: np.copyto(copied, x),
                check=same_result,
            ),
            SETTINGS,
        )
    )
    print(harness.text_table(rows))
    print(
        "\nfastpjit is for the calls whose cost is dispatch: Python scalars, parameter trees, "
        "pmap,\nbound serving calls. Where the program itself dominates (8 CPU devices "
        "sharing this\nmachine's cores), both dispatchers sit on the floor: a tie within "
        "the spread."
    )
    print("\nfastpjit.stats():", fastpjit.stats())


if __name__ == "__main__":
    main()
