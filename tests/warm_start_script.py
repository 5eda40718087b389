"""One side of the warm-start test, in a process of its own: `record PATH` serves calls and
saves their signatures; `replay PATH` warms up from the record, then makes the same calls,
which must all be cache hits with the results of jax.jit. Prints one JSON line."""

import functools
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import fastpjit


def layer(params, x, *, scale):
    return {"y": jnp.tanh(x @ params["w"] + params["b"]) * scale, "n": params["n"] + 1}


def power(x, n, mode="square"):
    return x**n if mode == "power" else x * x


def mean_over_devices(x):
    return jax.lax.pmean(x, "i")


OPTIMIZER = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2))


def train_step(params, opt_state, x, y):
    """An optax step: its state is a tuple of NamedTuples (ScaleByAdamState, EmptyState)."""
    loss, grads = jax.value_and_grad(lambda p: jnp.mean((x @ p["w"] + p["b"] - y) ** 2))(params)
    updates, opt_state = OPTIMIZER.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def functions():
    """The functions each process makes again, by the names they are saved under."""
    mesh = jax.make_mesh((2, 4), ("x", "y"))
    sharded = NamedSharding(mesh, P("x", None))
    jit_layer = fastpjit.jit(layer, out_shardings={"y": sharded, "n": None})
    jit_power = fastpjit.jit(power, static_argnums=1, static_argnames="mode")
    pmapped = fastpjit.pmap(mean_over_devices, axis_name="i")
    spec = jax.ShapeDtypeStruct((8, 4), jnp.float32, sharding=sharded)
    aot = fastpjit.jit(lambda x: x * 2 + 1).lower(spec).compile()
    hlo = fastpjit.compile_hlo(
        jax.jit(lambda a, b: a @ b)
        .lower(jax.ShapeDtypeStruct((4, 6), jnp.float32), jax.ShapeDtypeStruct((6, 8), jnp.float32))
        .as_text()
    )
    bound_layer = jit_layer.bind(params(mesh, 16))
    fns = {
        "train": fastpjit.jit(train_step),
        "layer": jit_layer,
        "power": jit_power,
        "pmap": pmapped,
        "aot": aot,
        "hlo": hlo,
        "bound": bound_layer,
    }
    return mesh, sharded, fns


def params(mesh, width):
    return {
        "w": jax.device_put(
            np.full((width, width), 0.01, np.float32), NamedSharding(mesh, P(None, "y"))
        ),
        "b": np.zeros(width, np.float32),
        "n": 3,
    }


def calls(mesh, sharded, fns):
    """The calls served: (name, args, kwargs, the jax.jit function to compare against)."""
    out = []
    for batch in (8, 16):
        model = {"w": jnp.full((4, 2), 0.1), "b": jnp.zeros(2)}
        data = (np.ones((batch, 4), np.float32), np.ones((batch, 2), np.float32))
        out.append(("train", (model, OPTIMIZER.init(model), *data), {}, jax.jit(train_step)))
    for width, batch in ((16, 8), (16, 16), (32, 8)):
        x = jax.device_put(np.ones((batch, width), np.float32), sharded)
        out.append(("layer", (params(mesh, width), x), {"scale": 2.0}, jax.jit(layer)))
    out.append(
        (
            "power",
            (np.arange(4.0), 3),
            {"mode": "power"},
            jax.jit(power, static_argnums=1, static_argnames="mode"),
        )
    )
    out.append(("power", (jnp.arange(4), 2), {}, jax.jit(power, static_argnums=1)))
    out.append(("power", (2.0, 2), {}, jax.jit(power, static_argnums=1)))
    out.append(
        ("pmap", (np.arange(16.0).reshape(8, 2),), {}, jax.pmap(mean_over_devices, axis_name="i"))
    )
    out.append(
        (
            "aot",
            (jax.device_put(np.ones((8, 4), np.float32), sharded),),
            {},
            jax.jit(lambda x: x * 2 + 1),
        )
    )
    out.append(
        (
            "hlo",
            (np.ones((4, 6), np.float32), np.ones((6, 8), np.float32)),
            {},
            jax.jit(lambda a, b: (a @ b,)),
        )
    )
    x = jax.device_put(np.ones((8, 16), np.float32), sharded)
    out.append(("bound", (x,), {"scale": 1.0}, jax.jit(functools.partial(layer, params(mesh, 16)))))
    return out


def main():
    mode, path = sys.argv[1], sys.argv[2]
    mesh, sharded, fns = functions()
    report = None
    if mode == "replay":
        report = fastpjit.warm_up(path, fns)
        fastpjit.reset_stats()
    results = []
    for name, args, kwargs, reference in calls(mesh, sharded, fns):
        ours = jax.tree.leaves(fns[name](*args, **kwargs))
        theirs = jax.tree.leaves(reference(*args, **kwargs))
        results.append(
            len(ours) == len(theirs)
            and all(np.array_equal(a, b) for a, b in zip(ours, theirs, strict=True))
        )
    stats = fastpjit.stats()
    if mode == "record":
        fastpjit.save_signatures(path, fns)
    print(
        json.dumps(
            {
                "equal": results,
                "hits": stats["cache_hits"],
                "misses": stats["cache_misses"],
                "fallbacks": stats["fallbacks"],
                "counts": report.counts() if report else None,
                "skipped": report.skipped() if report else None,
            }
        )
    )


if __name__ == "__main__":
    main()
