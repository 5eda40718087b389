"""fastpjit on the default backend and its devices, however many (one GPU, say), where the
test suite needs 8: results equal to JAX's, then µs per call (fastpjit, jax.jit, floor) by
fastpjit's own harness. Exits 1 if a result differs.

    JAX_PLATFORMS=cuda,cpu python tests/gpu_smoke.py
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import fastpjit
from fastpjit.bench import Settings, harness, measure_call

devs = jax.devices()
print("jax", jax.__version__, "| default backend", jax.default_backend(), "|", devs)
fails = []


def check(name, ours, theirs):
    ok = all(
        a.sharding == b.sharding and a.dtype == b.dtype and np.array_equal(a, b)
        for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True)
    )
    print(f"{'ok  ' if ok else 'FAIL'} {name}")
    if not ok:
        fails.append(name)


def step(params, x, lr):
    return jax.tree.map(lambda p: p - lr * jnp.sum(jnp.tanh(x)), params)


x = jnp.ones((256, 256))
tree = {f"l{i:04d}": jnp.full(4, i, jnp.float32) for i in range(1000)}
mm = lambda a, b: jnp.tanh(a) @ b + 1  # noqa: E731
check("jit matmul", fastpjit.jit(mm)(x, x), jax.jit(mm)(x, x))
check("jit 1000-leaf tree + scalar", fastpjit.jit(step)(tree, x, 0.1), jax.jit(step)(tree, x, 0.1))
n = jax.local_device_count()
stacked = np.arange(1, n * 4 + 1, dtype=np.float32).reshape(n, 4)
norm = lambda v: v / jax.lax.psum(v, "i")  # noqa: E731
check("pmap psum", fastpjit.pmap(norm, "i")(stacked), jax.pmap(norm, "i")(stacked))
mesh = Mesh(np.array(devs), ("x",))
s = NamedSharding(mesh, P("x"))
xs = jax.device_put(np.arange(8 * n, dtype=np.float32), s)
f2 = lambda v: v * 2  # noqa: E731
ours, theirs = fastpjit.jit(f2, out_shardings=s)(xs), jax.jit(f2, out_shardings=s)(xs)
check("jit NamedSharding P('x')", ours, theirs)
check("device_put", fastpjit.device_put(stacked, s), jax.device_put(stacked, s))
d = fastpjit.jit(lambda a: a + 1, donate_argnums=0)
a = jnp.ones(1024)
out = d(a)
out = d(out)
check("donation loop", out, jnp.full(1024, 3.0))
weights = jax.device_put({f"w{i:03d}": np.full((4,), i, np.float32) for i in range(100)})
serve = lambda p, v: jnp.tanh(v) * sum(q.sum() for q in jax.tree.leaves(p))  # noqa: E731
one = jnp.ones(4)
check("bound call", fastpjit.jit(serve).bind(weights)(one), jax.jit(serve)(weights, one))
S = Settings(rounds=15, round_s=0.01)
cases = [
    ("jit f(x), 1 device", lambda v: v + 1, (one,)),
    ("jit f(x, 2.0): a Python scalar", lambda v, c: v * c, (one, 2.0)),
    ("jit f(params, x, 0.1): 1000-leaf tree", step, (tree, one, 0.1)),
    ("jit (256,256) matmul", mm, (x, x)),
    ("bound g(x), 100 weights", fastpjit.jit(serve).bind(weights), (one,)),
]
print(f"\nµs per call on {harness.describe(harness.environment())}")
print(harness.text_table([measure_call(fn, args, {}, S, name=t).row for t, fn, args in cases]))
print("fastpjit.stats():", fastpjit.stats())
print("SMOKE", "FAILED: " + ", ".join(fails) if fails else "OK")
raise SystemExit(1 if fails else 0)
