"""`fastpjit.benchmark(fn, *args, **kwargs)`: what a call of `fn` costs under fastpjit, under
JAX, and at its floor (its executable run raw), timed in interleaved rounds after the results
were checked equal."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax

from fastpjit import _core
from fastpjit._jax import api as _jax
from fastpjit._jax import jit_options as _jax_jit_options
from fastpjit.bench import floors, harness
from fastpjit.bench.floors import Floor
from fastpjit.bind import Bound
from fastpjit.jit import Compiled, JitWrapped, jit
from fastpjit.pmap import PmapWrapped

__all__ = ["SETTINGS", "Benchmark", "benchmark", "measure_call"]

# About 2.5 s for a call of a few µs: 25 rounds of 20 ms per side, and 20 single calls per
# side and round for the percentiles.
SETTINGS = harness.Settings(rounds=25, round_s=0.02, singles=20)


@dataclass(frozen=True)
class Benchmark:
    """What `fastpjit.benchmark` measured: `str()` is a table, `.plot(path)` a PNG (with
    matplotlib), `.to_dict()` the numbers. Times are µs per call, results waited for."""

    row: dict[str, Any]
    environment: dict[str, Any]
    # The calls that fastpjit handed to JAX while timing, by reason.
    fallbacks: dict[str, int]

    @property
    def name(self) -> str:
        return str(self.row["name"])

    @property
    def speedup(self) -> float:
        """JAX's µs per call over fastpjit's."""
        return float(self.row["speedup"])

    @property
    def overhead_ratio(self) -> float | None:
        """(fastpjit − floor) / (JAX − floor): the share of JAX's cost above the floor that
        fastpjit still pays (0 is the floor, 1 is no better than JAX)."""
        ratio: float | None = self.row["overhead_ratio"]
        return ratio

    @property
    def trusted(self) -> bool:
        """Whether every side's rounds agree within `harness.TRUSTED_SPREAD`."""
        return not self.row["noisy"]

    def median_us(self, side: str) -> float:
        """The median over rounds of µs per call of `side`: "fastpjit", "JAX" or "floor"."""
        return float(self.row["stats"][_side_key(side)]["median"])

    def to_dict(self) -> dict[str, Any]:
        sides = {
            harness.LABELS[key]: {
                "median_us": stat["median"],
                "p25_us": stat["p25"],
                "p75_us": stat["p75"],
                "spread": stat["spread"],
                "p50_us": stat.get("p50"),
                "p90_us": stat.get("p90"),
                "p99_us": stat.get("p99"),
                "calls_per_round": stat["number"],
                "per_round_us": stat["per_round"],
            }
            for key, stat in self.row["stats"].items()
        }
        return {
            "name": self.name,
            "sides": sides,
            "speedup": self.speedup,
            "overhead_ratio": self.overhead_ratio,
            "trusted": self.trusted,
            "noisy": self.row["noisy"],
            "rounds": len(self.row["stats"]["ours"]["per_round"]),
            "timing": self.row["timing"],
            "fallbacks": self.fallbacks,
            "no_floor": self.row.get("no_floor"),
            "environment": self.environment,
        }

    def plot(self, path: str | Path) -> None:
        """Draws the overhead ratio, with the spread of its rounds, and each side's µs above
        the floor into `path` (PNG; see `harness.overhead_figure`). Needs matplotlib (`pip
        install fastpjit[tools]`)."""
        harness.overhead_plot([self.row], path, f"fastpjit.benchmark: {self.name}")

    def __str__(self) -> str:
        head = ("", "µs/call", "spread", "p50", "p90", "p99")
        body = [
            (
                harness.LABELS[key],
                harness.fmt_us(stat["median"]),
                f"{stat['spread']:.0%}",
                *(harness.fmt_us(stat.get(p)) for p in ("p50", "p90", "p99")),
            )
            for key, stat in self.row["stats"].items()
        ]
        rounds = len(self.row["stats"]["ours"]["per_round"])
        lines = [
            f"fastpjit.benchmark: {self.name}, {rounds} interleaved rounds, results "
            "checked equal, each call's results waited for",
            *harness.aligned([head, *body]),
        ]
        ratio = self.overhead_ratio
        lines.append(
            f"speedup {harness.fmt_ratio(self.speedup)} (JAX / fastpjit); overhead "
            f"ratio {'–' if ratio is None else f'{ratio:.2f}'} "
            "= (fastpjit − floor) / (JAX − floor)"
        )
        lines.append(f"on {harness.describe(self.environment)}")
        if "no_floor" in self.row:
            lines.append(f"no floor: {self.row['no_floor']}")
        for reason, n in self.fallbacks.items():
            lines.append(f"fastpjit handed {n} calls to JAX: {reason}")
        if not self.trusted:
            lines.append(
                f"! the rounds of {', '.join(self.row['noisy'])} spread over more than "
                f"{harness.TRUSTED_SPREAD:.0%} of their median: the machine was busy; "
                "do not trust these figures, measure again"
            )
        return "\n".join(lines)


def _side_key(side: str) -> str:
    for key, label in harness.LABELS.items():
        if side in (key, label):
            return key
    raise ValueError(f"side must be one of {', '.join(harness.LABELS.values())}, not {side!r}")


def benchmark(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Benchmark:
    """Times `fn(*args, **kwargs)` three ways: `fastpjit.jit(fn)`, `jax.jit(fn)`, and the floor
    (its executable run raw on inputs placed once, with its result handlers).

    `fn` is a plain function (jitted here by each), a jax.jit function, or a fastpjit
    function (jit, pjit, pmap, an AOT compiled one, or a bound one); each keeps its options.
    The results are checked equal first (`AssertionError` if not) and every side is called
    before timing, so compile time is not counted; each call waits for its results, as a
    user's loop does. Donated arguments are copied, untimed, before every call.
    """
    return measure_call(fn, args, kwargs)


def measure_call(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    settings: harness.Settings = SETTINGS,
    name: str | None = None,
) -> Benchmark:
    """`benchmark`, with its settings and the name shown."""
    sides = call_sides(fn, args, kwargs)
    before = _core.stats()["fallbacks"]
    row = harness.measure(name or _name(fn), sides, settings)
    after = _core.stats()["fallbacks"]
    fallbacks = {
        reason: n - before.get(reason, 0)
        for reason, n in after.items()
        if n != before.get(reason, 0)
    }
    return Benchmark(row, harness.environment(), fallbacks)


def _name(fn: Any) -> str:
    inner = fn._function if isinstance(fn, Bound) else fn
    name = getattr(getattr(inner, "__wrapped__", inner), "__name__", None) or repr(inner)
    return f"{name}(…)" + (" bound" if isinstance(fn, Bound) else "")


@dataclass(frozen=True)
class _Target:
    """The sides of a function: ours, JAX's, how to make the floor of a call, and which
    arguments the function donates (positions, names)."""

    ours: Callable[..., Any]
    theirs: Callable[..., Any]
    floor: Callable[[tuple[Any, ...], dict[str, Any]], Floor]
    donated: tuple[set[int], set[str]]


def _jit_target(fun: Any, options: dict[str, Any], ours: Any = None, theirs: Any = None) -> _Target:
    theirs = theirs if theirs is not None else _jax.jax_jit(floors.fresh(fun), **options)
    positions, names = _jax.jit_donated_args(theirs)
    return _Target(
        ours=ours if ours is not None else jit(fun, **options),
        theirs=theirs,
        floor=lambda a, k: floors.jit_floor(_jax.jax_jit(floors.fresh(fun), **options), a, k),
        donated=(set(positions), set(names)),
    )


def _target(fn: Any) -> _Target:
    if isinstance(fn, Bound):
        inner = _target(fn._function)
        bound_args, bound_kwargs = fn._args, fn._kwargs
        n = len(bound_args)
        positions, names = inner.donated
        return _Target(
            ours=fn,
            theirs=functools.partial(inner.theirs, *bound_args, **bound_kwargs),
            floor=lambda a, k: inner.floor((*bound_args, *a), bound_kwargs | k),
            donated=({p - n for p in positions if p >= n}, names),
        )
    if isinstance(fn, jax.stages.Compiled):
        fn = Compiled.of(fn)
    if isinstance(fn, Compiled):
        compiled = fn._compiled
        return _Target(
            ours=fn,
            theirs=compiled,
            floor=lambda a, k: floors.aot_floor(compiled, a, k),
            donated=fn._donated_arguments(),
        )
    if isinstance(fn, PmapWrapped):
        options = fn._make.keywords
        fun = fn.__wrapped__
        statics = tuple(options["static_broadcasted_argnums"])
        return _Target(
            ours=fn,
            theirs=_jax.jax_pmap(floors.fresh(fun), **options),
            floor=lambda a, k: floors.pmap_floor(
                _jax.jax_pmap(floors.fresh(fun), **options), a, k, statics
            ),
            donated=fn._donated_arguments(),
        )
    if isinstance(fn, JitWrapped):
        return _jit_target(fn.__wrapped__, dict(fn._make.keywords), ours=fn)
    if _jax_jit_options.is_jax_jit(fn):
        fun, options = _jax_jit_options.jit_function_and_options(fn)
        return _jit_target(fun, options, theirs=fn)
    if not callable(fn):
        raise TypeError(
            f"fastpjit.benchmark: fn must be a function, a jax.jit function or a "
            f"fastpjit function, got {type(fn).__name__}: {fn!r}"
        )
    return _jit_target(fn, {})


def call_sides(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> harness.Sides:
    """The `harness.Sides` of `fn(*args, **kwargs)`: fastpjit's, JAX's and the floor, each
    waiting for its results; the floor checked against JAX's result here, fastpjit's by
    `harness.measure`."""
    target = _target(fn)
    renew = _renewal(args, kwargs, *target.donated)
    ours = _waiting(target.ours, args, kwargs, renew)
    theirs = _waiting(target.theirs, args, kwargs, renew)
    try:
        floor = target.floor(*(renew() if renew else (args, kwargs)))
    except floors.NoFloor as err:
        return harness.Sides(
            ours=ours, jax=theirs, check=harness.same_result, meta={"no_floor": str(err)}
        )
    floor_call = floors.waiting_call(floor.renewing() if renew else harness.Call(floor))
    try:
        harness.same_result(harness.run_once(floor_call), harness.run_once(theirs))
    except AssertionError as err:
        raise harness.CheckFailed(f"the floor and JAX disagree: {err}") from err
    return harness.Sides(ours=ours, jax=theirs, floor=floor_call, check=harness.same_result)


def _waiting(
    f: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    renew: Callable[[], tuple[tuple[Any, ...], dict[str, Any]]] | None,
) -> harness.Call:
    block: Callable[[Any], Any] = jax.block_until_ready
    if renew is None:
        return harness.Call(lambda: block(f(*args, **kwargs)))
    current: list[Any] = [args, kwargs]

    def setup() -> None:
        current[:] = renew()

    return harness.Call(lambda: block(f(*current[0], **current[1])), setup)


def _renewal(
    args: tuple[Any, ...], kwargs: dict[str, Any], positions: set[int], names: set[str]
) -> Callable[[], tuple[tuple[Any, ...], dict[str, Any]]] | None:
    """What makes new donated arguments for a call (copies of the given ones, which stay
    whole), or None where no array is donated."""
    positions = {p if p >= 0 else len(args) + p for p in positions}
    donated = [a for i, a in enumerate(args) if i in positions]
    donated += [v for k, v in kwargs.items() if k in names]
    if not any(isinstance(leaf, jax.Array) for leaf in jax.tree.leaves(donated)):
        return None

    def copy(value: Any) -> Any:
        return jax.tree.map(floors.fresh_copy, value)

    def renew() -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (
            tuple(copy(a) if i in positions else a for i, a in enumerate(args)),
            {k: copy(v) if k in names else v for k, v in kwargs.items()},
        )

    return renew
