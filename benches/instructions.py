"""Instructions per call, fastpjit against jax.jit, counted by callgrind on the main thread.

Timings on a small shared machine move by 10% and more between runs; instruction counts do
not. This script runs each call pattern under callgrind's control, fastpjit's and JAX's in
turn, and prints the instructions per call that the calling thread ran (dispatch, transfers,
execution on the CPU, outputs). It needs valgrind, which is not a Python package
(`apt install valgrind`), and takes about 20 minutes:

    mkdir -p /tmp/fastpjit-cg && valgrind --tool=callgrind --instr-atstart=no \\
        --separate-threads=yes --callgrind-out-file=/tmp/fastpjit-cg/cg.out \\
        .venv/bin/python benches/instructions.py

Give case names (or parts of them) as arguments to run only those. Each count is the
difference between 300 calls and 100 calls, divided by 200, so that what starting and
stopping the count costs cancels out. The dumps stay in the output directory, for
`callgrind_annotate`. Programs with collectives are left out: valgrind runs one thread at a
time, and XLA's CPU collectives give up waiting for each other.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

import fastpjit
from fastpjit.bench import calls

CALLS = (100, 300)
OUT_DIR = Path("/tmp/fastpjit-cg")


def _cases() -> dict[str, tuple[Any, tuple[Any, ...], dict[str, Any], dict[str, Any]]]:
    """Each case: the function, its arguments and keyword arguments, and the jit options."""
    x = jax.device_put(jnp.ones((8, 4), jnp.float32), jax.devices()[0])
    mesh = jax.make_mesh((8,), ("d",))
    x8 = jax.device_put(jnp.ones((8, 4), jnp.float32), NamedSharding(mesh, P("d")))
    params = {f"l{i:03d}": x + i for i in range(100)}

    def add(a, b):
        return a + b

    def inc(a):
        return a + 1

    def sgd(p, x, lr):
        return jax.tree.map(lambda q: q - lr * jnp.sum(x), p)

    def outputs(n):
        return lambda a: {f"m{i:02d}": a * i for i in range(n)}

    on_device_1 = {"in_shardings": SingleDeviceSharding(jax.devices()[1])}
    cases = {
        "f(x)": (inc, (x,), {}),
        "f(x, 1.0)": (add, (x, 1.0), {}),
        "f(x, 2)": (add, (x, 2), {}),
        "f(x, np.float32(1.5))": (add, (x, np.float32(1.5)), {}),
        "f(x, numpy array)": (add, (x, np.ones((8, 4), np.float32)), {}),
        "f(x, new numpy array)": (
            add,
            (x, NewValues(np.full((8, 4), i, np.float32) for i in range(64))),
            {},
        ),
        "f(x, b=y)": (add, (x,), {"b": x}),
        "f(x, None)": (lambda a, b: a, (x, None), {}),
        "f(nested dicts and lists)": (
            lambda p: p["a"][0] + p["b"]["c"],
            ({"a": [x, x], "b": {"c": x}},),
            {},
        ),
        "f(params, x, lr=0.1), 100 leaves": (sgd, (params, x), {"lr": 0.1}),
        "f(x) → 3 outputs": (outputs(3), (x,), {}),
        "f(x) → 10 outputs": (outputs(10), (x,), {}),
        "f(x) → 32 outputs": (outputs(32), (x,), {}),
        "f(registered dataclass)": (calls.registered_step, (calls.Registered(x, x),), {}),
        "f(x) → tree of outputs": (calls.tree_out, (x,), {}),
        # Calls that fastpjit hands to JAX: an argument it cannot key.
        "f(x, ndarray subclass)": (add, (x, np.ones((8, 4), np.float32).view(SubArray)), {}),
        "f(params, ndarray subclass), 100 leaves": (
            sgd,
            (params, np.ones((8, 4), np.float32).view(SubArray)),
            {"lr": 0.1},
        ),
        "8 dev: f(x)": (inc, (x8,), {}),
        "8 dev: f(x, 1.0)": (add, (x8, 1.0), {}),
        "8 dev: f(x) → 3 outputs": (outputs(3), (x8,), {}),
    }
    cases = {name: (*case, {}) for name, case in cases.items()}
    cases["f(x, 3), static argnum"] = (calls.scale_static, (x, 3), {}, {"static_argnums": 1})
    # Uncommitted arrays on device 0, copied to the executable's device 1.
    cases["f(x) on dev 1, x uncommitted on 0"] = (inc, (jnp.ones((8, 4)),), {}, on_device_1)
    cases["f(x) on dev 1, new x uncommitted"] = (
        inc,
        (NewValues(jnp.full((8, 4), i, jnp.float32) for i in range(64)),),
        {},
        on_device_1,
    )
    return cases


class SubArray(np.ndarray):
    """A subclass of numpy's array, which JAX takes and fastpjit does not key."""


class NewValues:
    """An argument that takes the next of its values on every call, cycling."""

    def __init__(self, values: Any) -> None:
        self.next = itertools.cycle(list(values)).__next__


def _resolve(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(a.next() if isinstance(a, NewValues) else a for a in args)


class Callgrind:
    """Starts, stops and dumps the count of the callgrind running this process."""

    def __init__(self) -> None:
        self.pid = str(os.getpid())
        self.dumps = 0

    def _control(self, *args: str) -> None:
        subprocess.run(["callgrind_control", *args, self.pid], capture_output=True, check=False)

    def count(self, call: Any, n: int) -> int:
        """The instructions that this thread ran over `n` calls of `call`."""
        self._control("-z")
        self._control("-i", "on")
        for _ in range(n):
            call()
        self._control("-i", "off")
        self.dumps += 1
        label = f"fastpjit-{self.pid}-{self.dumps}"
        self._control("-d", label)
        return self._totals(label)

    def _totals(self, label: str) -> int:
        # The dump is written by the process itself, soon after it is asked for; "-01" is the
        # file of the main thread.
        for _ in range(400):
            for path in OUT_DIR.glob("*-01"):
                text = path.read_text()
                if f"Trigger: dump {label}\n" in text:
                    return sum(
                        int(line.split()[1])
                        for line in text.splitlines()
                        if line.startswith("totals:")
                    )
            time.sleep(0.05)
        raise RuntimeError(
            f"no callgrind dump {label} in {OUT_DIR}: run under callgrind "
            "(see this module's docstring)"
        )


def main() -> None:
    callgrind = Callgrind()
    wanted = sys.argv[1:]
    print(f"{'case':36s} {'fastpjit':>10s} {'jax.jit':>10s} {'difference':>11s}")
    for name, (fun, args, kwargs, options) in _cases().items():
        if wanted and not any(w in name for w in wanted):
            continue
        counts = {}
        for side, f in (("ours", fastpjit.jit(fun, **options)), ("jax", jax.jit(fun, **options))):
            if any(isinstance(a, NewValues) for a in args):

                def call(f=f, args=args, kwargs=kwargs):
                    return f(*_resolve(args), **kwargs)
            else:

                def call(f=f, args=args, kwargs=kwargs):
                    return f(*args, **kwargs)

            # Past the first recheck of a function whose calls go to JAX's dispatch (which
            # makes and compiles JAX's jit function): the counts are of the steady state.
            for _ in range(300):
                call()
            jax.block_until_ready(call())

            low, high = (callgrind.count(call, n) for n in CALLS)
            counts[side] = (high - low) / (CALLS[1] - CALLS[0])
        ours, theirs = counts["ours"], counts["jax"]
        print(f"{name:36s} {ours:10,.0f} {theirs:10,.0f} {ours - theirs:+11,.0f}", flush=True)


if __name__ == "__main__":
    main()
