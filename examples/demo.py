"""fastpjit demo on 8 CPU devices: pmap and pjit next to JAX's, index maps, and latencies.

Run with `make demo`.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import time  # noqa: E402
import warnings  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import fastpjit  # noqa: E402


def show_index(index):
    return "(" + ", ".join(":" if s.start is None else f"{s.start}:{s.stop}" for s in index) + ")"


def same(ours, theirs):
    leaves = zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True)
    return all(a.sharding == b.sharding and a.dtype == b.dtype and np.array_equal(a, b)
               for a, b in leaves)


def best_us(ours, theirs, calls=2000, rounds=7):
    """Best µs per call of each, their rounds interleaved so that both see the same machine."""
    best = {ours: float("inf"), theirs: float("inf")}
    for _ in range(rounds):
        for fn in best:
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            best[fn] = min(best[fn], (time.perf_counter() - start) / calls)
    return best[ours] * 1e6, best[theirs] * 1e6


def main():
    devices = jax.devices()
    print(f"fastpjit {fastpjit.__version__} on {len(devices)} {devices[0].platform} devices\n")
    x = np.arange(32, dtype=np.float32).reshape(8, 4)

    # pmap: the classic normalisation over a named axis.
    def normalise(v):
        return v / jax.lax.psum(v, "i")

    ours, theirs = fastpjit.pmap(normalise, "i")(x), jax.pmap(normalise, "i")(x)
    print("pmap(x / psum(x, 'i')) on an (8, 4) array:", "same as JAX" if same(ours, theirs)
          else "DIFFERENT FROM JAX")
    print("  row sums:", np.asarray(ours).sum(axis=0))

    # pjit, 2022 style: the old keywords and the old mesh context manager.
    mesh = Mesh(np.array(devices).reshape(2, 4), ("x", "y"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with mesh:
            out = fastpjit.pjit(lambda v: v * 2, in_axis_resources=None,
                                out_axis_resources=P("x", "y"))(x)
    print("\npjit(..., out_axis_resources=P('x', 'y')) under `with mesh:`:")
    for shard in out.addressable_shards[:4]:
        print(f"  device {shard.device.id}: {show_index(shard.index)}")
    print("  ...")

    # Index maps computed in Rust, equal to JAX's.
    sharding = NamedSharding(mesh, P(("y", "x")))
    assert fastpjit.devices_indices_map(sharding, (8, 4)) == sharding.devices_indices_map((8, 4))
    print("\ndevices_indices_map of P(('y', 'x')) on (8, 4): same as JAX")

    # Latency: the same trivial function through each dispatcher.
    print("\nµs per call (best of 7 rounds, interleaved):")
    print(f"  {'case':<38} {'fastpjit':>9} {'JAX':>9}")
    one = jnp.ones(4)
    sharded = jax.device_put(x, NamedSharding(mesh, P("x")))
    stacked = jax.pmap(lambda v: v)(x)
    cases = [
        ("jit, 1 device", fastpjit.jit(lambda v: v + 1), jax.jit(lambda v: v + 1), one),
        ("jit, 8 devices, P('x')", fastpjit.jit(lambda v: v + 1), jax.jit(lambda v: v + 1),
         sharded),
        ("pmap, 8 devices", fastpjit.pmap(lambda v: v + 1), jax.pmap(lambda v: v + 1), stacked),
        ("device_put (8, 4) P('x')", lambda v: fastpjit.device_put(v, sharding),
         lambda v: jax.device_put(v, sharding), x),
    ]
    for title, ours_fn, jax_fn, arg in cases:
        assert same(ours_fn(arg), jax_fn(arg))
        ours_us, jax_us = best_us(lambda f=ours_fn, a=arg: f(a), lambda f=jax_fn, a=arg: f(a))
        print(f"  {title:<38} {ours_us:>9.2f} {jax_us:>9.2f}")
    print("\nfastpjit.stats():", fastpjit.stats())


if __name__ == "__main__":
    main()
