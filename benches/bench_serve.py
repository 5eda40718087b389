"""Serving loops: a bound call (`fastpjit.jit(step).bind(params)`) against jax.jit and the floor

Each row calls `step(params, x)` with the same parameter tree on every call and a small `x`:
the bound side calls `g(x)` where `g = fastpjit.jit(step).bind(params)`, JAX's side
`jax.jit(step)(params, x)`, and the floor runs the executable raw on the flat inputs. Rows
named "plain" time `fastpjit.jit(step)(params, x)` instead, with the same objects every call;
rows named "numpy weights" bind host (numpy) parameters, which bind places once, while JAX's
side passes the same numpy tree on every call. Rows named "1 used" call a step that uses one
of the parameters (JAX prunes the others from the executable). The thread rows time a burst of
calls of `g(x)` spread over N threads (1000 calls each, each result waited for), per call:
their calls/s is 10⁶ / µs. Every row first checks that the bound call's results equal JAX's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import fastpjit
from fastpjit.bench.calls import burst
from fastpjit.bench.floors import fresh, jit_floor
from fastpjit.bench.harness import Case, Sides, same_result

COLUMNS = ("leaves", "devices")
THREAD_CALLS = 1000


def serve_step(params, x):
    # Every parameter is an input of the executable.
    total = jnp.stack([p.sum() for p in jax.tree.leaves(params)]).sum()
    return jnp.tanh(x) * total


def serve_one(params, x):
    # One parameter is an input; JAX prunes the others.
    return jnp.tanh(x) * params["layer0000"].sum()


def _setup(leaves: int, devices: int, numpy_weights: bool = False) -> tuple[Any, Any]:
    params = {f"layer{i:04d}": np.full((4,), i / leaves, np.float32) for i in range(leaves)}
    x = np.ones((8, 4), np.float32)
    if devices == 1:
        x = jax.device_put(x)
        if not numpy_weights:
            params = jax.device_put(params)
    else:
        mesh = jax.make_mesh((devices,), ("x",))
        x = jax.device_put(x, NamedSharding(mesh, P("x")))
        if not numpy_weights:
            params = jax.device_put(params, NamedSharding(mesh, P()))
    return params, x


def _bound(
    leaves: int,
    devices: int,
    plain: bool = False,
    numpy_weights: bool = False,
    step_fn: Callable[..., Any] = serve_step,
) -> Sides:
    params, x = _setup(leaves, devices, numpy_weights)
    step = fastpjit.jit(fresh(step_fn))
    theirs = jax.jit(fresh(step_fn))
    floor = jit_floor(jax.jit(fresh(step_fn)), (params, x), {})
    if plain:
        ours: Callable[[], Any] = lambda: step(params, x)  # noqa: E731
    else:
        g = step.bind(params)
        ours = lambda: g(x)  # noqa: E731
    wait = jax.block_until_ready if devices > 1 else (lambda out: out)
    return Sides(
        ours=lambda: wait(ours()),
        jax=lambda: wait(theirs(params, x)),
        floor=lambda: wait(floor()),
        check=same_result,
    )


def _threads(n: int, leaves: int = 10) -> Sides:
    params, x = _setup(leaves, 1)
    g = fastpjit.jit(fresh(serve_step)).bind(params)
    theirs = jax.jit(fresh(serve_step))
    floor = jit_floor(jax.jit(fresh(serve_step)), (params, x), {})

    return Sides(
        ours=burst(lambda: g(x), n, THREAD_CALLS),
        jax=burst(lambda: theirs(params, x), n, THREAD_CALLS),
        floor=burst(floor, n, THREAD_CALLS),
        check=same_result,
        calls=n * THREAD_CALLS + 1,
    )


def _case(name: str, build: Callable[[], Sides], leaves: int, devices: int) -> Case:
    return Case(name=name, build=build, devices=8, meta={"leaves": leaves, "devices": devices})


def _build_cases() -> list[Case]:
    cases = []
    for devices in (1, 8):
        for leaves in (10, 100, 1000):
            cases.append(
                _case(
                    f"bound, {leaves} leaves, {devices} dev",
                    lambda n=leaves, d=devices: _bound(n, d),
                    leaves,
                    devices,
                )
            )
            cases.append(
                _case(
                    f"plain, {leaves} leaves, {devices} dev",
                    lambda n=leaves, d=devices: _bound(n, d, plain=True),
                    leaves,
                    devices,
                )
            )
        cases.append(
            _case(
                f"bound numpy weights, 1000 leaves, {devices} dev",
                lambda d=devices: _bound(1000, d, numpy_weights=True),
                1000,
                devices,
            )
        )
        for numpy_weights in (False, True):
            cases.append(
                _case(
                    f"bound{' numpy weights' if numpy_weights else ''}, 200 leaves, 1 used, "
                    f"{devices} dev",
                    lambda d=devices, w=numpy_weights: _bound(
                        200, d, numpy_weights=w, step_fn=serve_one
                    ),
                    200,
                    devices,
                )
            )
    for n in (1, 2, 4, 8):
        cases.append(
            _case(
                f"bound, 10 leaves, 1 dev, {n} thread{'s' if n > 1 else ''}",
                lambda n=n: _threads(n),
                10,
                1,
            )
        )
    return cases


CASES = _build_cases()


def notes(rows: list[dict[str, Any]], processes: Any) -> str:
    """The issue's goals, measured."""
    by_name = {row["name"]: row for row in rows}
    lines = ["**Goals** (issue 29):"]
    for devices in (1, 8):
        row = by_name.get(f"bound, 1000 leaves, {devices} dev")
        if row:
            gap = row["ours_us"] - row["floor_us"]
            goal = max(0.02 * row["floor_us"], 5.0)
            lines.append(
                f"- 1000 bound leaves, {devices} dev: {gap:.1f} µs above the floor "
                f"(goal ≤ {goal:.1f}): {'met' if gap <= goal else '**not met**'}."
            )
        row = by_name.get(f"bound, 10 leaves, {devices} dev")
        if row:
            gap = row["ours_us"] - row["floor_us"]
            lines.append(
                f"- 10 bound leaves, {devices} dev: {gap:.2f} µs above the floor "
                f"(goal ≤ 1): {'met' if gap <= 1 else '**not met**'}."
            )
        numpy_row = by_name.get(f"bound numpy weights, 1000 leaves, {devices} dev")
        device_row = by_name.get(f"bound, 1000 leaves, {devices} dev")
        if numpy_row and device_row:
            lines.append(
                f"- numpy weights bound, {devices} dev: {numpy_row['ours_us']:.1f} µs "
                f"against {device_row['ours_us']:.1f} bound as device arrays."
            )
        numpy_row = by_name.get(f"bound numpy weights, 200 leaves, 1 used, {devices} dev")
        device_row = by_name.get(f"bound, 200 leaves, 1 used, {devices} dev")
        if numpy_row and device_row:
            lines.append(
                f"- 200 weights, 1 used, {devices} dev: {numpy_row['ours_us']:.1f} µs bound as "
                f"numpy against {device_row['ours_us']:.1f} bound as device arrays (issue 38)."
            )
    threads = by_name.get("bound, 10 leaves, 1 dev, 8 threads")
    if threads:
        ours, theirs = 1e6 / threads["ours_us"], 1e6 / threads["jax_us"]
        lines.append(
            f"- 8 threads: fastpjit {ours:,.0f} calls/s, JAX {theirs:,.0f} calls/s: "
            f"{'met' if ours >= theirs else '**not met**'}."
        )
    return "\n".join(lines)
