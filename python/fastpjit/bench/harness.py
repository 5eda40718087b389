"""The one place that times a call: cases, interleaved timing, checks, tables and plots, shared
by `fastpjit.benchmark`, `python -m fastpjit.bench`, `benches/` and the demo.

A benchmark module (`benches/bench_<name>.py`) declares `CASES`, a list of `Case`, and
`benches/run.py` does the rest (see its docstring for the optional `COLUMNS`, `PLOT`, `notes`).
A sketch:

    def _put(nbytes):                          # runs in a process with the case's devices
        x = np.ones(nbytes // 4, np.float32)
        s = SingleDeviceSharding(jax.devices()[0])
        return Sides(ours=lambda: fastpjit.device_put(x, s), jax=lambda: jax.device_put(x, s),
                     floor=lambda: x.copy(), check=lambda a, b: np.array_equal(a, b))

    CASES = [Case(f"device_put {n} B", build=partial(_put, n), devices=8, meta={"bytes": n})
             for n in (1 << 10, 1 << 20)]
"""

from __future__ import annotations

import gc
import itertools
import math
import os
import platform
import statistics
import time
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import jax
import numpy

from fastpjit import _core

SIDES = ("ours", "jax", "floor")
LABELS = {"ours": "fastpjit", "jax": "JAX", "floor": "floor"}
# A side whose rounds' interquartile range exceeds this share of its median is too noisy for
# its figure to be trusted (another process took the CPU, say).
TRUSTED_SPREAD = 0.1
TOOLS_HINT = "pip install fastpjit[tools]"


class CheckFailed(AssertionError):
    """Ours and JAX returned different results: the case's timings would mean nothing."""


@dataclass(frozen=True)
class Call:
    """A callable to time, and an untimed `setup` run before each of its calls."""

    fn: Callable[[], Any]
    setup: Callable[[], Any] | None = None


@dataclass
class Sides:
    """What one case times: ours (fastpjit), JAX's, and optionally the floor.

    Each side is a zero-argument callable or a `Call`. `check(ours_result, jax_result)` raises
    AssertionError or returns something false when they disagree; without it the results must
    be equal (`==`, or `numpy.array_equal` for arrays).
    """

    ours: Callable[[], Any] | Call
    jax: Callable[[], Any] | Call
    floor: Callable[[], Any] | Call | None = None
    check: Callable[[Any, Any], Any] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    # How many calls one invocation of a side makes (a burst on several threads, say): the
    # times are reported per call.
    calls: int = 1


@dataclass(frozen=True)
class Case:
    """One row of a benchmark table.

    `build` returns the case's `Sides` (so a case can be declared where its devices do not
    exist); it runs in a process with `devices` CPU devices (a
    separate process when that differs from the main one), or in the main one when `devices`
    is None. `meta` goes into the results, and the table shows the keys the module lists in
    `COLUMNS`.
    """

    name: str
    build: Callable[[], Sides]
    devices: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    # Rows whose goal is finer than their rounds' spread take this many times the rounds.
    rounds_factor: int = 1


@dataclass(frozen=True)
class Settings:
    """How long to measure: `rounds` interleaved rounds of about `round_s` seconds per side,
    and in each round `singles` calls per side timed one by one (for percentiles)."""

    rounds: int
    round_s: float
    max_number: int = 100_000
    singles: int = 0

    @classmethod
    def of(cls, quick: bool) -> Settings:
        return cls(rounds=7, round_s=0.002) if quick else cls(rounds=25, round_s=0.04)

    def for_case(self, case: Case) -> Settings:
        """These settings with the rounds that `case` takes."""
        return replace(self, rounds=self.rounds * case.rounds_factor)


@dataclass(frozen=True)
class Plot:
    """A log-log plot of µs per call against meta key `x`: one colour per `series`, one line
    per side, one panel per value of meta key `panel`."""

    file: str
    x: str
    series: str
    title: str
    panel: str | None = None
    xlabel: str | None = None


def _as_call(side: Callable[[], Any] | Call) -> Call:
    return side if isinstance(side, Call) else Call(side)


def run_once(call: Call) -> Any:
    """One call, after its setup."""
    if call.setup is not None:
        call.setup()
    return call.fn()


def _mean_ns(call: Call, number: int, per_call: bool) -> tuple[float, float, float]:
    """The mean ns per call over `number` calls: wall time, the process's CPU time (every
    thread's, XLA's execution included), and the CPU time of this thread (the one that issues
    the calls).

    Per call: each call is timed alone, after its setup, and its result is freed untimed.
    Otherwise the calls run back to back in one timed loop, as `timeit` runs them.
    """
    fn, setup = call.fn, call.setup
    wall, cpu, thread = time.perf_counter_ns, time.process_time_ns, time.thread_time_ns
    if not per_call:
        thread_start, cpu_start = thread(), cpu()
        start = wall()
        for _ in itertools.repeat(None, number):
            fn()
        end = wall()
        cpu_end, thread_end = cpu(), thread()
        return (
            (end - start) / number,
            (cpu_end - cpu_start) / number,
            (thread_end - thread_start) / number,
        )
    total = cpu_total = thread_total = 0
    for _ in itertools.repeat(None, number):
        if setup is not None:
            setup()
        thread_start, cpu_start = thread(), cpu()
        start = wall()
        result = fn()
        end = wall()
        cpu_total += cpu() - cpu_start
        thread_total += thread() - thread_start
        total += end - start
        del result
    return total / number, cpu_total / number, thread_total / number


def _stats(
    per_round_us: list[float], per_round_cpu_us: list[float], per_round_thread_us: list[float]
) -> dict[str, Any]:
    quartiles = statistics.quantiles(per_round_us, n=4) if len(per_round_us) > 1 else None
    median = statistics.median(per_round_us)
    p25 = quartiles[0] if quartiles else per_round_us[0]
    p75 = quartiles[2] if quartiles else per_round_us[0]
    return {
        "median": median,
        "min": min(per_round_us),
        "p25": p25,
        "p75": p75,
        # The rounds' interquartile range, as a share of their median.
        "spread": (p75 - p25) / median if median > 0 else 0.0,
        "per_round": per_round_us,
        # The process's CPU time per call, every thread's (median of rounds): a call that
        # returns before its execution ends shows its cost here, not in its wall time.
        "cpu": statistics.median(per_round_cpu_us),
        # The CPU time of the thread that issues the calls: what limits how fast calls that
        # do not wait for their results can be issued.
        "thread_cpu": statistics.median(per_round_thread_us),
    }


def check_sides(name: str, sides: Sides) -> None:
    """Runs ours and JAX once each, cold if they have setups, and compares the results."""
    ours = run_once(_as_call(sides.ours))
    theirs = run_once(_as_call(sides.jax))
    try:
        verdict = sides.check(ours, theirs) if sides.check else _equal(ours, theirs)
    except AssertionError as err:
        raise CheckFailed(f"{name}: fastpjit and JAX disagree: {err}") from err
    if verdict is not None and not bool(numpy.all(verdict)):
        raise CheckFailed(f"{name}: fastpjit and JAX disagree")


def _same_leaf(ours: Any, theirs: Any) -> None:
    assert type(ours) is type(theirs), f"{type(ours).__name__} != {type(theirs).__name__}"
    if not isinstance(theirs, jax.Array):
        assert ours == theirs
        return
    assert ours.aval == theirs.aval, f"aval {ours.aval} != {theirs.aval}"
    assert ours.aval.weak_type == theirs.aval.weak_type, "weak type differs"
    assert ours.sharding == theirs.sharding, f"sharding {ours.sharding} != {theirs.sharding}"
    assert ours.committed == theirs.committed, "commitment differs"
    assert numpy.array_equal(numpy.asarray(ours), numpy.asarray(theirs)), "values differ"


def same_result(ours: Any, theirs: Any) -> bool:
    """Raises AssertionError unless the two results agree leaf by leaf."""
    ours_tree: Any
    theirs_tree: Any
    ours_leaves, ours_tree = jax.tree.flatten(ours)
    theirs_leaves, theirs_tree = jax.tree.flatten(theirs)
    assert ours_tree == theirs_tree, f"tree {ours_tree} != {theirs_tree}"
    for a, b in zip(ours_leaves, theirs_leaves, strict=True):
        _same_leaf(a, b)
    return True


def _equal(ours: Any, theirs: Any) -> bool:
    if isinstance(ours, numpy.ndarray) or isinstance(theirs, numpy.ndarray):
        return numpy.array_equal(ours, theirs)
    return bool(ours == theirs)


def measure(name: str, sides: Sides, settings: Settings) -> dict[str, Any]:
    """Checks ours against JAX, then times every side in interleaved rounds.

    Each round times every side once, in an order that rotates from round to round; a side's
    figure is the median over rounds of its per-round mean, net of the cost of timing an empty
    call the same way. The garbage collector is off while timing, as in `timeit`. Each side's
    process CPU time per call, and its issuing thread's, are measured in the same rounds (`cpu`
    and `thread_cpu` in its stats).
    """
    check_sides(name, sides)
    calls = {
        side: _as_call(getattr(sides, side)) for side in SIDES if getattr(sides, side) is not None
    }
    per_call = any(call.setup is not None for call in calls.values())
    empty = Call(lambda: None, (lambda: None) if per_call else None)
    gc.collect()
    gc.disable()
    try:
        numbers = {side: _calibrate(call, per_call, settings) for side, call in calls.items()}
        empties = [_mean_ns(empty, 10_000, per_call) for _ in range(5)]
        empty_ns, empty_cpu_ns, empty_thread_ns = (min(kind) for kind in zip(*empties, strict=True))
        empty_single_ns = min(_single_ns(empty, 1000)) if settings.singles else 0
        samples: dict[str, list[float]] = {side: [] for side in calls}
        cpu_samples: dict[str, list[float]] = {side: [] for side in calls}
        thread_samples: dict[str, list[float]] = {side: [] for side in calls}
        singles: dict[str, list[float]] = {side: [] for side in calls}
        order = list(calls)
        for round_index in range(settings.rounds):
            shift = round_index % len(order)
            for side in order[shift:] + order[:shift]:
                ns, cpu_ns, thread_ns = _mean_ns(calls[side], numbers[side], per_call)
                samples[side].append(max(ns - empty_ns, 0.0) / 1e3 / sides.calls)
                cpu_samples[side].append(max(cpu_ns - empty_cpu_ns, 0.0) / 1e3 / sides.calls)
                thread_samples[side].append(
                    max(thread_ns - empty_thread_ns, 0.0) / 1e3 / sides.calls
                )
                # No more single calls than the round's loop makes: slow calls stay quick.
                count = min(settings.singles, numbers[side])
                singles[side] += [
                    max(ns - empty_single_ns, 0) / 1e3 / sides.calls
                    for ns in _single_ns(calls[side], count)
                ]
    finally:
        gc.enable()
    stats = {
        side: _stats(us, cpu_samples[side], thread_samples[side])
        | {"number": numbers[side]}
        | _percentiles(singles[side])
        for side, us in samples.items()
    }
    return _row(name, sides, stats, per_call, empty_ns / 1e3)


def _single_ns(call: Call, number: int) -> list[int]:
    """`number` calls, each timed alone (its setup and the freeing of its result untimed)."""
    fn, setup, clock = call.fn, call.setup, time.perf_counter_ns
    times = []
    for _ in itertools.repeat(None, number):
        if setup is not None:
            setup()
        start = clock()
        result = fn()
        times.append(clock() - start)
        del result
    return times


def _percentiles(us: list[float]) -> dict[str, float]:
    """p50, p90 and p99 of single calls' µs (none without samples)."""
    if len(us) < 2:
        return {}
    cuts = statistics.quantiles(us, n=100, method="inclusive")
    return {"p50": cuts[49], "p90": cuts[89], "p99": cuts[98], "singles": len(us)}


def _calibrate(call: Call, per_call: bool, settings: Settings) -> int:
    """How many calls make one round of about `settings.round_s` seconds."""
    estimate_ns = min(_mean_ns(call, 1, per_call)[0] for _ in range(5))
    number = int(settings.round_s * 1e9 / max(estimate_ns, 1.0))
    if number >= 10:
        estimate_ns = min(_mean_ns(call, 10, per_call)[0] for _ in range(2))
        number = int(settings.round_s * 1e9 / max(estimate_ns, 1.0))
    return max(1, min(number, settings.max_number))


def _row(
    name: str, sides: Sides, stats: dict[str, Any], per_call: bool, empty_us: float
) -> dict[str, Any]:
    ours = stats["ours"]["median"]
    theirs = stats["jax"]["median"]
    floor = stats["floor"]["median"] if "floor" in stats else None
    overhead = None
    if floor is not None and theirs > floor:
        overhead = (ours - floor) / (theirs - floor)
    noisy = [LABELS[side] for side, stat in stats.items() if stat["spread"] > TRUSTED_SPREAD]
    return {
        "name": name,
        "ours_us": ours,
        "jax_us": theirs,
        "floor_us": floor,
        "speedup": theirs / ours if ours > 0 else math.inf,
        "overhead_ratio": overhead,
        "noisy": noisy,
        "timing": "each call alone, setup untimed" if per_call else "back-to-back loop",
        "empty_call_us": empty_us,
        "stats": stats,
        **sides.meta,
    }


# Reporting


def fmt_us(us: float | None) -> str:
    """Three significant figures, thousands separated."""
    if us is None:
        return "–"
    if us >= 100:
        return f"{us:,.0f}"
    return f"{us:.3g}" if us >= 1 else f"{us:.2f}"


def fmt_ratio(x: float | None, unit: str = "×") -> str:
    if x is None:
        return "–"
    if math.isinf(x):
        return "∞"
    return f"{x:.1f}{unit}" if abs(x) < 100 else f"{x:,.0f}{unit}"


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] = ()) -> str:
    """The table of one benchmark: a row per case, times in µs per call."""
    has_floor = any(row["floor_us"] is not None for row in rows)
    head = ["case", *columns, "fastpjit µs", "JAX µs"]
    if has_floor:
        head.append("floor µs")
    head.append("speedup (JAX/ours)")
    if has_floor:
        head.append("overhead ratio")
    lines = [
        "| " + " | ".join(head) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|",
    ]
    for row in rows:
        cells = [
            row["name"],
            *(str(row.get(column, "")) for column in columns),
            fmt_us(row["ours_us"]),
            fmt_us(row["jax_us"]),
        ]
        if has_floor:
            cells.append(fmt_us(row["floor_us"]))
        cells.append(fmt_ratio(row["speedup"]))
        if has_floor:
            ratio = row["overhead_ratio"]
            cells.append("–" if ratio is None else f"{ratio:.2f}")
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def text_table(rows: Sequence[dict[str, Any]]) -> str:
    """The rows for a terminal: µs per call (median over rounds), speedup, overhead ratio, and
    the widest spread of a row's sides, marked `!` where it is too wide to trust."""
    head = ("case", "fastpjit µs", "JAX µs", "floor µs", "speedup", "overhead", "spread")
    body = []
    for row in rows:
        widest = max(stat["spread"] for stat in row["stats"].values())
        ratio = row["overhead_ratio"]
        body.append(
            (
                row["name"],
                fmt_us(row["ours_us"]),
                fmt_us(row["jax_us"]),
                fmt_us(row["floor_us"]),
                fmt_ratio(row["speedup"]),
                "–" if ratio is None else f"{ratio:.2f}",
                f"{widest:.0%}" + (" !" if row["noisy"] else ""),
            )
        )
    lines = aligned([head, *body])
    lines.insert(1, "-" * len(lines[0]))
    if any(row["noisy"] for row in rows):
        lines.append(
            f"! a side's rounds spread over more than {TRUSTED_SPREAD:.0%} of its "
            "median: the machine was busy; rerun those rows before trusting them"
        )
    return "\n".join(lines)


def aligned(table: Sequence[Sequence[str]]) -> list[str]:
    """The lines of a table for a terminal: its first column left-aligned, the others right."""
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    return [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(line, widths, strict=True))
        )
        for line in table
    ]


def environment() -> dict[str, Any]:
    """What a result was measured on, so that people can share it: the platform, its devices,
    the versions, and the machine's load when measuring began."""
    devices = jax.devices()
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            names = [
                line.split(":", 1)[1].strip() for line in info if line.startswith("model name")
            ]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return {
        "platform": devices[0].platform,
        "device_kind": devices[0].device_kind,
        "device_count": len(devices),
        "cpu": cpu,
        "cores": (
            len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        ),
        "os": platform.platform(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": jax.lib.__version__,
        "numpy": numpy.__version__,
        "fastpjit": _core.__version__,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def describe(env: dict[str, Any]) -> str:
    """`environment()` in one line."""
    load = ", ".join(map(str, env["load_average"]))
    return (
        f"{env['device_count']} × {env['platform']} ({env['device_kind']}) on {env['cpu']}, "
        f"{env['cores']} cores; Python {env['python']}, jax {env['jax']}, jaxlib "
        f"{env['jaxlib']}, numpy {env['numpy']}, fastpjit {env['fastpjit']}; "
        f"load average {load}"
    )


def loglog_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The least-squares slope of log(y) against log(x): 1 means linear growth."""
    lx = [math.log(x) for x in xs]
    ly = [math.log(y) for y in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum(
        (a - mx) ** 2 for a in lx
    )


def _pyplot() -> types.ModuleType:
    """matplotlib's pyplot, drawing to files only."""
    try:
        import matplotlib
    except ImportError as err:
        raise ImportError(
            f"plotting needs matplotlib, which is not installed: {TOOLS_HINT} "
            "(tables work without it)"
        ) from err
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# The overhead figure: the ratios it spans (a row beyond is drawn at the edge, as an arrow),
# the height of a row, and the resolution it is saved at.
RATIO_LIMITS = (0.0, 2.0)
ROW_INCHES = 0.24
FIGURE_DPI = 110


def _rounds(row: dict[str, Any], *sides: str) -> Iterator[tuple[float, ...]]:
    """Each round's µs of `sides`: the sides are timed in the same rounds, so one round's
    figures compare times measured together."""
    stats = row["stats"]
    return zip(*(stats[side]["per_round"] for side in sides), strict=True)


def round_ratios(row: dict[str, Any]) -> list[float]:
    """The overhead ratio of each round where JAX was above the floor."""
    if "floor" not in row["stats"]:
        return []
    rounds = _rounds(row, "ours", "jax", "floor")
    return [(ours - floor) / (theirs - floor) for ours, theirs, floor in rounds if theirs > floor]


def paired_gap(row: dict[str, Any], side: str, other: str) -> tuple[float, float, float]:
    """The median over rounds of `side`'s µs less `other`'s in the same round (drift between
    rounds cancels), and the 95% confidence interval of that median (its order statistics)."""
    gaps = sorted(a - b for a, b in _rounds(row, side, other))
    n = len(gaps)
    k = max(0, int(n / 2 - 0.98 * math.sqrt(n)))
    return statistics.median(gaps), gaps[k], gaps[n - 1 - k]


def _above_floor(row: dict[str, Any]) -> str:
    """What a row's overhead ratio is made of: each side's µs above the floor, and the floor."""
    floor = row["floor_us"]
    if floor is None:
        return f"no floor; fastpjit {fmt_us(row['ours_us'])}, JAX {fmt_us(row['jax_us'])} µs"

    def above(us: float) -> str:
        return ("+" if us >= floor else "−") + fmt_us(abs(us - floor))

    return f"fastpjit {above(row['ours_us'])}, JAX {above(row['jax_us'])} µs; floor {fmt_us(floor)}"


def overhead_figure(rows: Sequence[dict[str, Any]], title: str) -> Any:
    """A matplotlib figure of each row's overhead ratio, (fastpjit − floor) / (JAX − floor):
    one line per row, a dot at the median of the rounds' ratios (each round times the sides
    together, so its ratio does not mix a busy moment of one side with a quiet one of another),
    a bar over their interquartile range, and a line at 1 (as JAX); on the right, each side's
    µs above the floor. Rows with no floor, or JAX at the floor, have no dot."""
    plt = _pyplot()
    low, high = RATIO_LIMITS
    fig, ax = plt.subplots(figsize=(12, 1.9 + ROW_INCHES * len(rows)), dpi=FIGURE_DPI)
    colours = {True: "tab:blue", False: "tab:red"}
    for i, row in enumerate(rows):
        if row["overhead_ratio"] is None:
            why = "no floor to compare with" if row["floor_us"] is None else "JAX at the floor"
            ax.text(low + 0.02, i, why, va="center", fontsize=7, color="0.4", style="italic")
            continue
        rounds = round_ratios(row)
        ratio = statistics.median(rounds) if rounds else row["overhead_ratio"]
        if len(rounds) > 1:
            q1, _, q3 = statistics.quantiles(rounds, n=4)
            ax.plot([max(q1, low), min(q3, high)], [i, i], color="0.6", linewidth=2.5)
        shown = min(max(ratio, low), high)
        marker = "o" if shown == ratio else ("<" if ratio < low else ">")
        ax.plot(shown, i, marker, color=colours[ratio <= 1], markersize=6)
    ax.axvline(1, color="0.2", linewidth=1)
    ax.axvline(0, color="0.2", linewidth=0.6, linestyle=":")
    ax.set_xlim(low - 0.05, high + 0.05)
    ax.set_xticks([0, 0.5, 1, 1.5, 2], ["0: the floor", "0.5", "1: as JAX", "1.5", "≥ 2"])
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_yticks(range(len(rows)), [row["name"] for row in rows], fontsize=8)
    right = ax.twinx()
    right.set_ylim(ax.get_ylim())
    right.set_yticks(range(len(rows)), [_above_floor(row) for row in rows], fontsize=8)
    ax.set_xlabel(
        "overhead ratio = (fastpjit − floor) / (JAX − floor): the share of JAX's time above "
        "the floor that fastpjit spends (left of 1: less than JAX)\ndot: the median of the "
        "rounds' ratios (each round times the three sides together), blue below 1, red above, "
        "an arrow beyond the axis; grey bar: their interquartile range\nright: each side's "
        "median µs per call above the floor, and the floor's",
        fontsize=8,
    )
    ax.grid(True, axis="y", alpha=0.25)
    ax.grid(True, axis="x", alpha=0.4)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def overhead_plot(rows: Sequence[dict[str, Any]], path: str | Path, title: str) -> None:
    """`overhead_figure` into `path` (PNG)."""
    plt = _pyplot()
    fig = overhead_figure(rows, title)
    fig.savefig(path, dpi=FIGURE_DPI)
    plt.close(fig)


def plot(rows: Sequence[dict[str, Any]], spec: Plot, path: Path) -> None:
    """Draws `spec` from the rows into `path` (PNG)."""
    plt = _pyplot()

    panels = list(dict.fromkeys(row.get(spec.panel) for row in rows)) if spec.panel else [None]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.4 * len(panels), 4.8), squeeze=False)
    styles = {"ours": ("-", "o", 2.0), "jax": ("--", "s", 1.5), "floor": (":", "", 1.2)}
    for ax, panel in zip(axes[0], panels, strict=True):
        shown = [row for row in rows if spec.panel is None or row.get(spec.panel) == panel]
        series = list(dict.fromkeys(row[spec.series] for row in shown))
        for colour, name in zip(
            itertools.cycle(plt.rcParams["axes.prop_cycle"].by_key()["color"]), series
        ):
            points = sorted(
                (row for row in shown if row[spec.series] == name), key=lambda row: row[spec.x]
            )
            xs = [row[spec.x] for row in points]
            for side, (line, marker, width) in styles.items():
                ys = [row[f"{side}_us"] for row in points]
                if any(y is None for y in ys):
                    continue
                ax.plot(
                    xs,
                    ys,
                    line,
                    marker=marker,
                    color=colour,
                    linewidth=width,
                    label=f"{LABELS[side]}: {name}",
                )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(spec.xlabel or spec.x)
        ax.set_ylabel("µs per call")
        ax.set_title(str(panel) if panel is not None else spec.title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    if spec.panel:
        fig.suptitle(spec.title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
