"""Placing new numpy arrays: jaxlib's `batched_device_put`, one array per call (what fastpjit's
dispatcher does for each host argument of a call), against the batched C++ `shard_args` that
jaxlib has from 0.11.2 (JAX itself uses it only under `jax_use_cpp_shard_args`, off by
default). `python benches/shard_args.py [--quick]` prints µs per placement of all the arrays,
timed as the benchmarks are (interleaved rounds, medians), and checks the placed values agree.

The batched call would replace fastpjit's per-argument puts only where it places the same
arrays for less; docs/performance.md gives the numbers and the verdict.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax._src.lib import _jax  # noqa: E402
from jax._src.lib import xla_client as xc  # noqa: E402
from jax.sharding import NamedSharding, SingleDeviceSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from fastpjit._jax import rust_handles  # noqa: E402
from fastpjit.bench import harness  # noqa: E402


def placements(sharding, arrays):
    """The two ways of placing `arrays` on `sharding`, as the harness's sides."""
    shape, dtype = arrays[0].shape, arrays[0].dtype
    placement = rust_handles.placement_sharding(sharding, len(shape))
    aval = rust_handles.device_put_aval(shape, dtype, False, placement)
    devices = list(placement._device_assignment)
    index = list(sharding.devices_indices_map(shape).values())

    def one_by_one():
        return [
            xc.batched_device_put(
                aval,
                placement,
                [x[i] for i in index],
                devices,
                False,
                False,
                xc.HostBufferSemantics.ZERO_COPY,
            )
            for x in arrays
        ]

    n = len(arrays)
    semantics = [xc.ArrayCopySemantics.REUSE_INPUT] * n

    def batched():
        return _jax.shard_args([sharding] * n, [None] * n, semantics, list(arrays))

    def same(ours, theirs):
        return all(
            np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(ours, theirs, strict=True)
        )

    return harness.Sides(ours=one_by_one, jax=batched, check=same)


def main() -> None:
    if not hasattr(_jax, "shard_args"):
        sys.exit(f"jaxlib {jax.lib.__version__} has no batched shard_args (it came in 0.11.2)")
    settings = harness.Settings.of("--quick" in sys.argv)
    devices = jax.devices()
    mesh = jax.make_mesh((8,), ("x",), devices=devices)
    shardings = {
        "1 device": SingleDeviceSharding(devices[0]),
        "8 devices, P('x')": NamedSharding(mesh, P("x")),
        "8 devices, P()": NamedSharding(mesh, P()),
    }
    print(f"jax {jax.__version__}: µs to place new numpy arrays (float32)\n")
    rows = [("placement", "batched_device_put, one by one", "shard_args, batched", "ratio")]
    for where, sharding in shardings.items():
        for shape in ((32, 16), (1024, 256)):
            for n in (1, 4):
                rng = np.random.default_rng(0)
                arrays = [rng.standard_normal(shape, dtype=np.float32) for _ in range(n)]
                name = f"{where}: {n} × {shape}"
                row = harness.measure(name, placements(sharding, arrays), settings)
                ours, theirs = row["ours_us"], row["jax_us"]
                rows.append(
                    (name, harness.fmt_us(ours), harness.fmt_us(theirs), f"{theirs / ours:.2f}")
                )
                print("  " + "  ".join(rows[-1]), file=sys.stderr, flush=True)
    print("\n".join(harness.aligned(rows)))


if __name__ == "__main__":
    main()
