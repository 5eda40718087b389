"""The call-pattern matrix: `fastpjit.jit`/`pmap` against `jax.jit`/`pmap` on the calls people
write, as rows of `fastpjit.bench.harness` (for `benches/bench_calls.py` and
`python -m fastpjit.bench`).

Each row is one way of calling a compiled function in a loop, timed on cache hits (every side
is called once, untimed, before the timing): scalars of each Python type, numpy scalars and
arrays, keyword and static arguments, alternating signatures, parameter trees with a keyword
learning rate, custom pytree nodes, None leaves, trees of outputs (a small one, and a dict of
32), donation loops, AOT compiled functions, new arrays (placed or numpy) on every call, and
several threads at once. Rows that cycle through several calls (alternating dtypes, say) cycle
the same way on every side.

The **floor** is the same executable run raw (`execute_sharded` and the result handlers) on
inputs already placed on the devices: numpy arrays and Python scalars are placed once, before
the timing, so where a call must place one, the floor is below what any dispatcher can reach.
In the donation loop, the floor threads its state through the executable as the others do.
Rows whose executable communicates between devices wait for each result on every side (XLA's
CPU collectives abort when hundreds are in flight); their times include the execution. The
thread rows time a burst of calls spread over N threads, each thread started for the burst;
their µs are per call, so their calls/s is 10⁶ / µs, and the scaling notes divide by the
1-thread row. In short bursts (64 calls per thread) the threads hand the GIL to each other on
nearly every call; in long ones (1000 per thread) each thread runs many calls in a row.

Every row first checks that fastpjit's results equal JAX's (tree, values, dtypes, weak types,
shardings, commitment), and that fastpjit's second call was a cache hit with no fallback.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jax.typing import ArrayLike

import fastpjit
from fastpjit._jax.jit_miss import jit_cache_miss, pmap_cache_miss
from fastpjit.bench.floors import (
    fresh,
    has_collectives,
    jit_floor,
    placed_inputs,
    pmap_floor,
    runner,
    waiting,
)
from fastpjit.bench.harness import Case, CheckFailed, Sides, same_result

SHAPE = (8, 4)
THREAD_CALLS = 64
LONG_THREAD_CALLS = 1000


def _cycle(functions: Sequence[Callable[[], Any]]) -> Callable[[], Any]:
    if len(functions) == 1:
        return functions[0]
    nexts = itertools.cycle(functions).__next__
    return lambda: nexts()()


def _calls(f: Any, calls: list[tuple[tuple[Any, ...], dict[str, Any]]]) -> Callable[[], Any]:
    return _cycle([partial(f, *a, **k) for a, k in calls])


# Calls with new numpy arrays that fastpjit hands to jax.jit's C++ dispatch, which places them
# faster (see rust/core/src/delegation.rs): counted as fallbacks of this code.
DELEGATED = "delegated"


def _check_hit(
    ours: Any, calls: list[tuple[tuple[Any, ...], dict[str, Any]]], hits_per_call: int = 1
) -> None:
    """fastpjit's second round of calls: hits only (or calls handed to JAX's dispatch for
    their new numpy arrays), no other fallback; `hits_per_call` where a call is several."""
    for args, kwargs in calls:
        ours(*args, **kwargs)
    before = fastpjit.stats()
    for args, kwargs in calls:
        ours(*args, **kwargs)
    after = fastpjit.stats()
    fallbacks = {
        reason: n - before["fallbacks"].get(reason, 0)
        for reason, n in after["fallbacks"].items()
        if n != before["fallbacks"].get(reason, 0)
    }
    hits = after["cache_hits"] - before["cache_hits"] + fallbacks.pop(DELEGATED, 0)
    if (
        hits != hits_per_call * len(calls)
        or fallbacks
        or after["cache_misses"] != before["cache_misses"]
    ):
        raise CheckFailed(
            f"the second calls were not all hits: {hits} hits of {len(calls)}, "
            f"fallbacks {fallbacks}"
        )


def _sides(
    kind: str, fun: Any, calls: list[tuple[tuple[Any, ...], dict[str, Any]]], **options: Any
) -> Sides:
    """Ours and JAX's `kind` ("jit" or "pmap") of `fun`, cycling through `calls`, and the
    floor of each call's executable."""
    if kind == "jit":
        ours, theirs = fastpjit.jit(fun, **options), jax.jit(fresh(fun), **options)
        floors = [jit_floor(jax.jit(fresh(fun), **options), a, k) for a, k in calls]
    else:
        ours, theirs = fastpjit.pmap(fun, **options), jax.pmap(fresh(fun), **options)
        statics = options.get("static_broadcasted_argnums", ())
        statics = (statics,) if isinstance(statics, int) else tuple(statics)
        floors = [pmap_floor(jax.pmap(fresh(fun), **options), a, k, statics) for a, k in calls]
    for (args, kwargs), floor in zip(calls, floors, strict=True):
        try:
            same_result(floor(), theirs(*args, **kwargs))
        except AssertionError as err:
            raise CheckFailed(f"the floor and JAX disagree: {err}") from err
    _check_hit(ours, calls)
    sides = [_calls(ours, calls), _calls(theirs, calls), _cycle(floors)]
    if any(has_collectives(floor.fast_path) for floor in floors):
        sides = [waiting(side) for side in sides]
    return Sides(ours=sides[0], jax=sides[1], floor=sides[2], check=same_result)


# --- Arguments ------------------------------------------------------------------------------


def _sharding(devices: int) -> jax.sharding.Sharding:
    if devices == 1:
        return jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return NamedSharding(jax.make_mesh((devices,), ("x",)), P("x"))


def _array(devices: int, shape: tuple[int, ...] = SHAPE, offset: float = 0.0) -> jax.Array:
    """An array on the first `devices` devices; uncommitted on device 0 for `devices` 0."""
    host = np.arange(np.prod(shape), dtype=np.float32).reshape(shape) + offset
    array: jax.Array = jax.device_put(host, _sharding(devices) if devices else None)
    return array


def _stacked(devices: int, *shape: int) -> jax.Array:
    """A pmap input as a previous pmap leaves it."""
    host = np.arange(devices * int(np.prod(shape)), dtype=np.float32).reshape(devices, *shape)
    stacked: jax.Array = jax.pmap(lambda v: v, devices=jax.devices()[:devices])(host)
    return stacked


def _params(leaves: int, devices: int) -> dict[str, jax.Array]:
    sharding = (
        _sharding(devices)
        if devices == 1
        else NamedSharding(jax.make_mesh((devices,), ("x",)), P())
    )
    return {
        f"layer{i:04d}": jax.device_put(np.full((4,), i, np.float32), sharding)
        for i in range(leaves)
    }


class State(NamedTuple):
    params: Any
    step: Any


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Registered:
    w: Any
    b: Any


# --- The functions --------------------------------------------------------------------------


def plus_one(x: jax.Array) -> jax.Array:
    return x + 1


def scale(x: jax.Array, s: ArrayLike) -> jax.Array:
    return x * s


def add(x: jax.Array, y: ArrayLike) -> jax.Array:
    return x + y


def scale_static(x: jax.Array, n: int) -> jax.Array:
    return x * n


def sgd(params: dict[str, jax.Array], x: jax.Array, lr: float) -> dict[str, jax.Array]:
    updated: dict[str, jax.Array] = jax.tree.map(lambda p: p - lr * jnp.sum(x), params)
    return updated


def state_step(state: State) -> State:
    return State(jax.tree.map(lambda p: p + 1, state.params), state.step + 1)


def registered_step(r: Registered) -> Registered:
    return Registered(r.w * 2, r.b + 1)


def with_nones(tree: dict[str, Any]) -> jax.Array:
    a: jax.Array = tree["a"]
    c: jax.Array = tree["c"][0]
    return a + c


def tree_out(x: jax.Array) -> dict[str, Any]:
    return {"double": x * 2, "pair": (x + 1, x.sum())}


def metrics_out(x: jax.Array) -> dict[str, jax.Array]:
    return {f"metric{i:02d}": x * i for i in range(32)}


def loop_step(state: jax.Array, x: jax.Array) -> jax.Array:
    return state * 0.5 + x


# --- Rows -----------------------------------------------------------------------------------

Calls = list[tuple[tuple[Any, ...], dict[str, Any]]]


def _jit_patterns() -> dict[str, Callable[[int], tuple[Any, Calls, dict[str, Any]]]]:
    """Each jit row: name → (devices → function, calls cycled, jit options)."""
    x = _array

    def tree(d: int) -> dict[str, Any]:
        return {"a": x(d), "b": None, "c": (x(d), None)}

    return {
        "f(x)": lambda d: (plus_one, [((x(d),), {})], {}),
        "f(x, s): s = 1.0, 2, True in turn": lambda d: (
            scale,
            [((x(d), 1.0), {}), ((x(d), 2), {}), ((x(d), True), {})],
            {},
        ),
        "f(x, np.float32(1.5))": lambda d: (scale, [((x(d), np.float32(1.5)), {})], {}),
        "f(x, numpy array)": lambda d: (add, [((x(d), np.ones(SHAPE, np.float32)), {})], {}),
        "f(x, y=y)": lambda d: (add, [((x(d),), {"y": x(d)})], {}),
        "f(x, 3), static argnum": lambda d: (
            scale_static,
            [((x(d), 3), {})],
            {"static_argnums": 1},
        ),
        "f(x, n=3), static argname": lambda d: (
            scale_static,
            [((x(d),), {"n": 3})],
            {"static_argnames": "n"},
        ),
        "f(x) alternating two shapes": lambda d: (
            plus_one,
            [((x(d),), {}), ((x(d, (8, 8)),), {})],
            {},
        ),
        "f(params, x, lr=0.1), 100 leaves": lambda d: (
            sgd,
            [((_params(100, d), x(d)), {"lr": 0.1})],
            {},
        ),
        "f(params, x, lr=0.1), 1000 leaves": lambda d: (
            sgd,
            [((_params(1000, d), x(d)), {"lr": 0.1})],
            {},
        ),
        "f(namedtuple state)": lambda d: (state_step, [((State(_params(100, d), x(d)),), {})], {}),
        "f(registered dataclass)": lambda d: (
            registered_step,
            [((Registered(x(d), x(d)),), {})],
            {},
        ),
        "f(tree with None leaves)": lambda d: (with_nones, [((tree(d),), {})], {}),
        "f(x) → tree of outputs": lambda d: (tree_out, [((x(d),), {})], {}),
        "f(x) → dict of 32 outputs": lambda d: (metrics_out, [((x(d),), {})], {}),
    }


def _pmap_patterns() -> dict[str, Callable[[int], tuple[Any, Calls, dict[str, Any]]]]:
    """Each pmap row: name → (devices → function, calls cycled, pmap options)."""
    x = _stacked

    def on(d: int, **options: Any) -> dict[str, Any]:
        return {"devices": jax.devices()[:d], **options}

    return {
        "f(x)": lambda d: (plus_one, [((x(d, 4),), {})], on(d)),
        "f(x, 1.0), in_axes=(0, None)": lambda d: (
            scale,
            [((x(d, 4), 1.0), {})],
            on(d, in_axes=(0, None)),
        ),
        "f(x, s): s = 1.0, 2, True in turn, in_axes=(0, None)": lambda d: (
            scale,
            [((x(d, 4), 1.0), {}), ((x(d, 4), 2), {}), ((x(d, 4), True), {})],
            on(d, in_axes=(0, None)),
        ),
        "f(x, 3), static broadcast": lambda d: (
            scale_static,
            [((x(d, 4), 3), {})],
            on(d, static_broadcasted_argnums=1),
        ),
        "f(x, y=y)": lambda d: (add, [((x(d, 4),), {"y": x(d, 4)})], on(d)),
        "f(x, numpy array)": lambda d: (add, [((x(d, 4), np.ones((d, 4), np.float32)), {})], on(d)),
        "f(x) alternating two shapes": lambda d: (
            plus_one,
            [((x(d, 4),), {}), ((x(d, 8),), {})],
            on(d),
        ),
        "f(x) → tree of outputs": lambda d: (tree_out, [((x(d, 4),), {})], on(d)),
        "f(x) → dict of 32 outputs": lambda d: (metrics_out, [((x(d, 4),), {})], on(d)),
    }


def _donation_loop(kind: str, d: int) -> Sides:
    """`state = f(state, x)` with the state donated, on every side."""
    wrap: Any
    oracle: Any
    make: Callable[[], jax.Array]
    if kind == "jit":
        wrap, oracle, make = fastpjit.jit, jax.jit, lambda: _array(d)
        options: dict[str, Any] = {"donate_argnums": 0}
    else:
        wrap, oracle, make = fastpjit.pmap, jax.pmap, lambda: _stacked(d, 4)
        options = {"donate_argnums": 0, "devices": jax.devices()[:d]}
    x = make()
    ours, theirs = wrap(loop_step, **options), oracle(fresh(loop_step), **options)
    floor_fn = oracle(fresh(loop_step), **options)
    miss = (
        jit_cache_miss(floor_fn, (make(), x), {})
        if kind == "jit"
        else pmap_cache_miss(floor_fn, (make(), x), {})
    )
    run = runner(miss.fast_path)
    states = {
        "ours": ours(make(), x),
        "jax": theirs(make(), x),
        "floor": run(placed_inputs(miss.fast_path, [make(), x])),
    }
    _check_hit(lambda s, y: states.__setitem__("ours", ours(states["ours"], y)), [((None, x), {})])

    def step(side: str, f: Callable[[Any, Any], Any]) -> Callable[[], Any]:
        def call() -> Any:
            states[side] = f(states[side], x)
            return states[side]

        return call

    floor_x = placed_inputs(miss.fast_path, [make(), x])[1]
    return Sides(
        ours=step("ours", ours),
        jax=step("jax", theirs),
        floor=step("floor", lambda s, _: run([s, floor_x])),
        check=lambda a, b: np.asarray(a).shape == np.asarray(b).shape,
    )


def _aot(d: int) -> Sides:
    x = _array(d)
    ours = fastpjit.jit(plus_one).lower(x).compile()
    theirs = jax.jit(fresh(plus_one)).lower(x).compile()
    floor = jit_floor(jax.jit(fresh(plus_one)), (x,), {})
    same_result(floor(), theirs(x))
    _check_hit(ours, [((x,), {})])
    return Sides(ours=lambda: ours(x), jax=lambda: theirs(x), floor=floor, check=same_result)


def _new_arrays(d: int) -> Sides:
    """Each call gets arrays it has not seen: 64 distinct arrays of one shape, placed by
    jax.device_put (as a data loader's batches are), cycled."""
    return _new_batches(plus_one, [((_array(d, offset=i),), {}) for i in range(64)])


def _new_host_arrays(d: int) -> Sides:
    """f(x, batch) where each call's batch is a numpy array of values not seen in the latest
    calls: 64 distinct arrays, cycled. The floor's batches are placed before the timing."""
    x = _array(d)
    return _new_batches(add, [((x, np.full(SHAPE, i, np.float32)), {}) for i in range(64)])


def _new_batches(fun: Any, calls: Calls, **options: Any) -> Sides:
    ours, theirs = fastpjit.jit(fun, **options), jax.jit(fresh(fun), **options)
    miss = jit_cache_miss(jax.jit(fresh(fun), **options), *calls[0])
    run = runner(miss.fast_path)
    placed = [placed_inputs(miss.fast_path, list(args)) for args, _ in calls]
    floors = [lambda p=p: run(p) for p in placed]
    _check_hit(ours, calls)
    return Sides(
        ours=_calls(ours, calls), jax=_calls(theirs, calls), floor=_cycle(floors), check=same_result
    )


def train_step(
    params: tuple[jax.Array, jax.Array], x: jax.Array, y: jax.Array
) -> tuple[tuple[jax.Array, jax.Array], jax.Array]:
    def loss(p: tuple[jax.Array, jax.Array]) -> jax.Array:
        w, b = p
        return jnp.mean((jnp.tanh(x @ w) + b - y) ** 2)

    value, grads = jax.value_and_grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads), value


def _training_rows(kind: str, width: int) -> list[tuple[str, Callable[[], Sides]]]:
    """The training-step rows of `kind` on `width` devices: a small and a mid-sized batch."""
    return [
        (
            f"training step, a new {size} numpy batch ({n_rows}×{features}) every step",
            partial(_training_batches, kind, width, n_rows, features),
        )
        for n_rows, features, size in ((32, 16, "small"), (1024, 256, "mid-sized"))
    ]


def _training_batches(kind: str, d: int, rows: int, features: int) -> Sides:
    """A training step fed a new numpy batch (x, y) every step, as data loaders feed it: 16
    distinct batches of `rows` × `features` float32, cycled; the parameters are the step's own
    outputs. On 8 devices the batch is split over the devices (jit: in_shardings over a mesh;
    pmap: a leading device axis) and the parameters replicated."""
    rng = np.random.default_rng(0)
    lead = (d,) if kind == "pmap" else ()
    per = rows // d if kind == "pmap" else rows
    batches = [
        (
            rng.standard_normal((*lead, per, features), dtype=np.float32),
            rng.standard_normal((*lead, per, 1), dtype=np.float32),
        )
        for _ in range(16)
    ]
    w, b = np.full((features, 1), 0.01, np.float32), np.zeros((1,), np.float32)
    if kind == "pmap":
        options: dict[str, Any] = {"devices": jax.devices()[:d]}
        params = jax.pmap(lambda v: v, **options)((np.stack([w] * d), np.stack([b] * d)))
        ours, theirs = fastpjit.pmap(train_step, **options), jax.pmap(fresh(train_step), **options)
        floor_fn = jax.pmap(fresh(train_step), **options)
        miss = pmap_cache_miss(floor_fn, (params, *batches[0]), {})
    else:
        options = {}
        if d > 1:
            mesh = jax.make_mesh((d,), ("x",))
            replicated, split = NamedSharding(mesh, P()), NamedSharding(mesh, P("x"))
            options = {"in_shardings": ((replicated, replicated), split, split)}
            params = jax.device_put((w, b), replicated)
        else:
            params = jax.device_put((w, b))
        ours, theirs = fastpjit.jit(train_step, **options), jax.jit(fresh(train_step), **options)
        miss = jit_cache_miss(jax.jit(fresh(train_step), **options), (params, *batches[0]), {})
    run = runner(miss.fast_path)
    placed = [placed_inputs(miss.fast_path, [*jax.tree.leaves(params), x, y]) for x, y in batches]
    calls: Calls = [((params, x, y), {}) for x, y in batches]
    _check_hit(ours, calls)
    floors = [lambda p=p: run(p) for p in placed]
    sides = [_calls(ours, calls), _calls(theirs, calls), _cycle(floors)]
    if has_collectives(miss.fast_path):
        sides = [waiting(side) for side in sides]
    return Sides(ours=sides[0], jax=sides[1], floor=sides[2], check=same_result)


def _rewrapped(d: int) -> Sides:
    """`jit(f)(x)` with a new jit function on every call, as code that jits inside a loop
    does; JAX keys its cache by the function and options, so each side hits its cache."""
    x = _array(d)
    theirs_fun = fresh(plus_one)
    floor = jit_floor(jax.jit(fresh(plus_one)), (x,), {})
    _check_hit(lambda v: fastpjit.jit(plus_one)(v), [((x,), {})])
    return Sides(
        ours=lambda: fastpjit.jit(plus_one)(x),
        jax=lambda: jax.jit(theirs_fun)(x),
        floor=floor,
        check=same_result,
    )


def _chained_pmaps(d: int) -> Sides:
    """`g(f(x))`: a pmap of a previous pmap's output, on every call."""
    options: dict[str, Any] = {"devices": jax.devices()[:d]}
    x = np.arange(d * 4, dtype=np.float32).reshape(d, 4)

    def second(v: jax.Array) -> jax.Array:
        return v * 2

    f_ours, g_ours = fastpjit.pmap(plus_one, **options), fastpjit.pmap(second, **options)
    f_jax, g_jax = jax.pmap(fresh(plus_one), **options), jax.pmap(fresh(second), **options)
    f_miss = pmap_cache_miss(jax.pmap(fresh(plus_one), **options), (x,), {})
    y = f_ours(x)
    g_miss = pmap_cache_miss(jax.pmap(fresh(second), **options), (y,), {})
    run_f, run_g = runner(f_miss.fast_path), runner(g_miss.fast_path)
    x_placed = placed_inputs(f_miss.fast_path, [x])
    x_ours = f_ours(x)  # the same input, placed, on every side: a pmap's output too
    _check_hit(lambda v: g_ours(f_ours(v)), [((x_ours,), {})], hits_per_call=2)
    return Sides(
        ours=lambda: g_ours(f_ours(x_ours)),
        jax=lambda: g_jax(f_jax(x_ours)),
        floor=lambda: run_g([run_f(x_placed)]),
        check=same_result,
    )


def _threads(n: int, d: int, calls: int = THREAD_CALLS) -> Sides:
    """A burst of calls of f(x) on `n` threads at once (`calls` each), per call."""
    x = _array(d)
    ours, theirs = fastpjit.jit(plus_one), jax.jit(fresh(plus_one))
    floor = jit_floor(jax.jit(fresh(plus_one)), (x,), {})
    _check_hit(ours, [((x,), {})])

    return Sides(
        ours=burst(lambda: ours(x), n, calls),
        jax=burst(lambda: theirs(x), n, calls),
        floor=burst(floor, n, calls),
        check=same_result,
        calls=n * calls + 1,
    )


def burst(f: Callable[[], Any], n: int, calls: int) -> Callable[[], Any]:
    """A burst of `calls` calls of `f` on each of `n` threads, started for the burst (on this
    thread for `n` = 1), then one more call, whose result the burst returns."""

    def run() -> Any:
        def loop() -> None:
            for _ in range(calls):
                f()

        if n == 1:
            loop()
        else:
            threads = [threading.Thread(target=loop) for _ in range(n)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        return f()

    return run


def _on_device_1(new: bool) -> Sides:
    """f(x) with in_shardings on device 1, x uncommitted on device 0 (new on every call, or
    the same)."""
    on_device_1 = {"in_shardings": jax.sharding.SingleDeviceSharding(jax.devices()[1])}
    if new:
        return _new_batches(
            plus_one, [((_array(0, offset=i),), {}) for i in range(64)], **on_device_1
        )
    return _sides("jit", plus_one, [((_array(0),), {})], **on_device_1)


def _pattern_row(kind: str, name: str, d: int) -> Sides:
    patterns = _jit_patterns() if kind == "jit" else _pmap_patterns()
    fun, calls, options = patterns[name](d)
    return _sides(kind, fun, calls, **options)


def cases(widths: tuple[int, ...], process_devices: int | None = None) -> list[Case]:
    """The matrix's rows, jit and pmap ones on each device count in `widths` (the devices of
    the process, as `process_devices` asks for, must be at least the largest)."""

    def case(name: str, build: Callable[[], Sides], kind: str, devices: int) -> Case:
        return Case(
            name=f"{kind}, {devices} dev: {name}",
            build=build,
            devices=process_devices,
            meta={"kind": kind, "devices": devices},
        )

    rows = []
    for d in widths:
        for name in _jit_patterns():
            rows.append(case(name, partial(_pattern_row, "jit", name, d), "jit", d))
        rows.append(
            case("state = f(state, x), donated", partial(_donation_loop, "jit", d), "jit", d)
        )
        rows.append(case("AOT compiled f(x)", partial(_aot, d), "jit", d))
        rows.append(case("f(new array) on every call", partial(_new_arrays, d), "jit", d))
        rows.append(
            case("f(x, new numpy array) on every call", partial(_new_host_arrays, d), "jit", d)
        )
        rows.append(
            case("jit(f)(x): a new jit function on every call", partial(_rewrapped, d), "jit", d)
        )
        rows += [case(name, fn, "jit", d) for name, fn in _training_rows("jit", d)]
    if max(widths) > 1:
        # An uncommitted array on device 0, and in_shardings on device 1: JAX's dispatch copies
        # it there in C++ on every call; fastpjit copies it with jaxlib, and uses the copy again
        # when the same array comes again. (Onto 8 devices, JAX's Python moves it, on either
        # side, and fastpjit counts a fallback.)
        rows.append(
            case(
                "f(x) with in_shardings, x uncommitted on another device",
                partial(_on_device_1, new=False),
                "jit",
                1,
            )
        )
        rows.append(
            case(
                "f(x) with in_shardings, a new x uncommitted on another device",
                partial(_on_device_1, new=True),
                "jit",
                1,
            )
        )
    for d in widths:
        for name in _pmap_patterns():
            rows.append(case(name, partial(_pattern_row, "pmap", name, d), "pmap", d))
        rows.append(
            case("state = f(state, x), donated", partial(_donation_loop, "pmap", d), "pmap", d)
        )
        rows.append(
            case(
                "g(f(x)): a pmap of a previous pmap's output", partial(_chained_pmaps, d), "pmap", d
            )
        )
        rows += [case(name, fn, "pmap", d) for name, fn in _training_rows("pmap", d)]
    for n in (1, 2, 8):
        rows.append(
            case(f"f(x) on {n} thread{'s' if n > 1 else ''}", partial(_threads, n, 1), "threads", 1)
        )
    for n in (2, 8):
        rows.append(
            case(
                f"f(x) on {n} threads, {LONG_THREAD_CALLS} calls each",
                partial(_threads, n, 1, LONG_THREAD_CALLS),
                "threads",
                1,
            )
        )
    return rows
