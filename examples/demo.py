"""fastpjit demo: index maps of a few shardings next to JAX's, and how long each takes.

Run with `make demo` (8 CPU devices).
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import time  # noqa: E402

import fastpjit  # noqa: E402
import jax  # noqa: E402
from fastpjit import _jax  # noqa: E402
from jax.sharding import AbstractMesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402


def show_index(index):
    return "(" + ", ".join(
        ":" if s.start is None else f"{s.start}:{s.stop}" for s in index
    ) + ")"


def compare(title, sharding, shape):
    ours = fastpjit.devices_indices_map(sharding, shape)
    theirs = sharding.devices_indices_map(shape)
    verdict = "same as JAX" if ours == theirs else "DIFFERENT FROM JAX"
    print(f"\n{title}  shape={shape}  ({verdict})")
    for device, index in ours.items():
        print(f"  device {device.id}: {show_index(index)}   jax: {show_index(theirs[device])}")
    assert ours == theirs


def cold_us(fn, clear=lambda: None, repeats=200):
    best = float("inf")
    for _ in range(5):
        total = 0.0
        for _ in range(repeats):
            clear()
            start = time.perf_counter()
            fn()
            total += time.perf_counter() - start
        best = min(best, total / repeats)
    return best * 1e6


def main():
    devices = jax.devices()
    print(f"fastpjit {fastpjit.__version__} on {len(devices)} {devices[0].platform} devices")
    mesh = jax.make_mesh((2, 4), ("x", "y"))
    compare("NamedSharding P('x')", NamedSharding(mesh, P("x")), (8, 4))
    compare("NamedSharding P(('y', 'x'))", NamedSharding(mesh, P(("y", "x"))), (8, 4))
    compare("NamedSharding P('y', 'x')", NamedSharding(mesh, P("y", "x")), (8, 8))
    hlo = "{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}"
    compare(f"parse_hlo_sharding {hlo}", fastpjit.parse_hlo_sharding(hlo, devices), (8, 4))

    print("\nCold index-map latency (JAX's caches cleared before each of its calls):")
    print(f"  {'case':<34} {'fastpjit µs':>12} {'JAX µs':>10} {'speedup':>8}")
    for title, sharding, shape in [
        ("P('x', 'y') on 2x4, (8, 8)", NamedSharding(mesh, P("x", "y")), (8, 8)),
        ("P('x') on 2x4, (8, 4)", NamedSharding(mesh, P("x")), (8, 4)),
    ]:
        ours = cold_us(lambda s=sharding, sh=shape: fastpjit.devices_indices_map(s, sh))
        theirs = cold_us(lambda s=sharding, sh=shape: s.devices_indices_map(sh),
                         clear=_jax.clear_index_map_caches)
        print(f"  {title:<34} {ours:>12.2f} {theirs:>10.2f} {theirs / ours:>7.1f}x")

    big = NamedSharding(AbstractMesh((64, 512), ("data", "model")), P("data", "model"))
    start = time.perf_counter()
    bounds = fastpjit.indices_array(big, (4096, 8192))
    elapsed = (time.perf_counter() - start) * 1e3
    print(f"\nAbstract mesh of {bounds.shape[0]} devices: indices_array {bounds.shape} "
          f"in {elapsed:.2f} ms; device 1 holds rows {bounds[1, 0]} and columns {bounds[1, 1]}")


if __name__ == "__main__":
    main()
