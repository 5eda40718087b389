"""Inputs that must not crash the process, even where JAX's own path does: x64 switched per
thread, deep pytrees, hostile HLO, arrays deleted mid-call. Each check that could crash runs in
a child process, so that a crash fails its test instead of ending the suite."""

import subprocess
import sys
import textwrap

import pytest


def run_child(script: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args],
                          capture_output=True, text=True, timeout=timeout)


def assert_ok(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, (result.returncode, result.stdout[-3000:],
                                    result.stderr[-3000:])
    assert result.stdout.strip().endswith("ok"), result.stdout[-3000:]


# x64 per thread. jaxlib's `canonicalize_value`, which JAX's `shard_args` converts host values
# with, does not always see the calling thread's x64 while other threads switch it: a miss ran
# the fresh executable on a buffer of the other width. The child makes it see the wrong width
# every time, so that the check does not depend on the race.
X64_WRONG_VIEW_CHILD = """
import numpy as np, jax, fastpjit
from jax._src import dtypes
from jax.sharding import NamedSharding, PartitionSpec as P

true_canonicalize_value = dtypes.canonicalize_value

def wrong_view(value):
    with jax.enable_x64(not jax.config.jax_enable_x64):
        return true_canonicalize_value(value)

dtypes.canonicalize_value = wrong_view
mesh = jax.make_mesh((8,), ("x",))
x = np.arange(8, dtype=np.float64)
for make in (lambda: fastpjit.jit(lambda a, s: a * s),
             lambda: fastpjit.jit(lambda a, s: a * s, in_shardings=(
                 NamedSharding(mesh, P("x")), NamedSharding(mesh, P())))):
    f = make()
    for x64 in (False, True, False, True):
        with jax.enable_x64(x64):
            out = f(x, 1.5)
            assert out.dtype == (np.float64 if x64 else np.float32), out.dtype
            np.testing.assert_array_equal(np.asarray(out), x * 1.5)
print("ok")
"""


@pytest.mark.timeout(120)
def test_a_miss_places_host_values_as_its_executable_takes_them():
    assert_ok(run_child(X64_WRONG_VIEW_CHILD))


X64_THREADS_CHILD = """
import sys, threading, numpy as np, jax, fastpjit

mode, rounds, calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
x = np.arange(8, dtype=np.float64)
errors = []

def run(f, barrier, i):
    x64 = i % 2 == 0
    try:
        barrier.wait()
        device = jax.devices()[i] if mode == "device" else None
        with jax.default_device(device):
            for _ in range(calls):
                with jax.enable_x64(x64):
                    out = f(x, 1.5)
                    assert out.dtype == (np.float64 if x64 else np.float32), out.dtype
    except Exception as err:
        errors.append(f"{x64}: {err!r}"[:300])

for _ in range(rounds):
    f = fastpjit.jit(lambda a, s: a * s)
    barrier = threading.Barrier(4)
    threads = [threading.Thread(target=run, args=(f, barrier, i)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:2]
print("ok")
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["one_device", "device"])
def test_x64_switched_per_thread(mode):
    # Four threads, two of them under jax.enable_x64, each round with a fresh function (so
    # that misses race too); with jax.default_device per thread in "device".
    assert_ok(run_child(X64_THREADS_CHILD, mode, "12", "60", timeout=110))
