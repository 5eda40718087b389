"""Reproduction (not a test): an array deleted by one thread while another thread's calls use
it. Each trial is a child process; the crash rate is printed per configuration.

    python tests/deleted_mid_call.py [trials]

Configurations: JAX's and fastpjit's jit over 1 and 8 devices, and pmap over 8; `guarded` runs
the same calls with `ArrayImpl.delete` replaced by one that waits for the calls in flight on the
array and their outputs (a prototype of the only way found to keep the deletion from freeing
buffers mid-call with jaxlib 0.10.2, see the issue 28 notes in the commit log).
"""

import os
import subprocess
import sys

CHILD = """
import collections, random, sys, threading, time
import numpy as np, jax, fastpjit
from jax.sharding import NamedSharding, PartitionSpec as P
from jax._src.array import ArrayImpl

api, ndev, seed, guarded = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
random.seed(seed)
devices = jax.devices()[:ndev]
n = 1 << 20
lib = jax if api.startswith("jax") else fastpjit
if api.endswith("pmap"):
    f = lib.pmap(lambda a: a * 2.0 + 1.0, devices=devices)
    ident = jax.pmap(lambda a: a, devices=devices)
    make = lambda: ident(np.ones((ndev, n // ndev), np.float32))
else:
    f = lib.jit(lambda a: (a * 2.0 + 1.0).sum())
    mesh = jax.make_mesh((ndev,), ("x",), devices=devices)
    make = lambda: jax.device_put(np.ones(n, np.float32), NamedSharding(mesh, P("x")))
call = f
if guarded:
    in_use, changed = collections.Counter(), threading.Condition()
    delete = ArrayImpl.delete
    def guarded_delete(self):
        with changed:
            changed.wait_for(lambda: in_use[id(self)] == 0)
            delete(self)
    ArrayImpl.delete = guarded_delete
    def call(a):
        with changed:
            in_use[id(a)] += 1
        try:
            # The launch on several devices reads the inputs after the call returns.
            return jax.block_until_ready(f(a))
        finally:
            with changed:
                in_use[id(a)] -= 1
                changed.notify_all()
call(make())
x = make()
stop = threading.Event()
def caller():
    while not stop.is_set():
        try:
            call(x)
        except Exception:  # JAX's error for a deleted array: what should happen
            return
thread = threading.Thread(target=caller)
thread.start()
time.sleep(random.random() * 0.003)
x.delete()
stop.set()
thread.join()
"""

CONFIGS = [
    ("jax", 1),
    ("fastpjit", 1),
    ("jax", 8),
    ("fastpjit", 8),
    ("jaxpmap", 8),
    ("fastpjitpmap", 8),
]


def main() -> None:
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    env = dict(
        os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu"
    )
    for guarded in ("0", "1"):
        for api, ndev in CONFIGS:
            crashed = failed = 0
            for seed in range(trials):
                done = subprocess.run(
                    [sys.executable, "-c", CHILD, api, str(ndev), str(seed), guarded],
                    capture_output=True,
                    env=env,
                    timeout=120,
                )
                crashed += done.returncode < 0
                failed += done.returncode > 0
            label = "guarded " if guarded == "1" else ""
            print(
                f"{label}{api} on {ndev} devices: {crashed}/{trials} crashed"
                + (f", {failed} failed otherwise" if failed else ""),
                flush=True,
            )


if __name__ == "__main__":
    main()
