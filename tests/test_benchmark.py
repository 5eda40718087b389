"""fastpjit.benchmark and `python -m fastpjit.bench`: structure, checks and outputs (never
timing relations, which a busy machine can upset; speed is measured in benches/)."""

import itertools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import fastpjit
from fastpjit.bench import CheckFailed, Settings, harness, measure_call

# A few short rounds: these tests check what a benchmark reports, not how fast anything is.
QUICK = Settings(rounds=3, round_s=0.001, singles=3)
SIDES = ("fastpjit", "JAX", "floor")


def _check_report(result, rounds=QUICK.rounds):
    report = result.to_dict()
    json.dumps(report)
    assert set(report["sides"]) == set(SIDES)
    for side, stats in report["sides"].items():
        assert stats["median_us"] > 0, side
        assert len(stats["per_round_us"]) == rounds
        assert all(us >= 0 for us in stats["per_round_us"])
        assert stats["p25_us"] <= stats["median_us"] <= stats["p75_us"]
        assert stats["p50_us"] <= stats["p90_us"] <= stats["p99_us"]
        assert stats["spread"] >= 0
    ours, theirs, floor = (report["sides"][s]["median_us"] for s in SIDES)
    assert report["speedup"] == pytest.approx(theirs / ours)
    if theirs > floor:
        assert report["overhead_ratio"] == pytest.approx((ours - floor) / (theirs - floor))
    else:
        assert report["overhead_ratio"] is None
    assert report["trusted"] == (not report["noisy"])
    assert report["environment"]["device_count"] == len(jax.devices())
    table = str(result)
    for word in (*SIDES, "speedup", "overhead ratio", "p99", result.name):
        assert word in table
    return report


def scale(x, s):
    return x * s


def test_benchmark_is_exported():
    assert "benchmark" in fastpjit.__all__
    assert fastpjit.benchmark is fastpjit.bench.benchmark


@pytest.mark.timeout(120)
def test_a_plain_function_with_a_python_scalar():
    result = measure_call(scale, (jnp.ones((8, 4)), 2.0), {}, QUICK)
    report = _check_report(result)
    assert report["name"] == "scale(…)"
    assert result.median_us("fastpjit") == report["sides"]["fastpjit"]["median_us"]
    with pytest.raises(ValueError, match="side must be one of"):
        result.median_us("numba")


@pytest.mark.timeout(120)
def test_a_jax_jit_function_keeps_its_statics_shardings_and_donation():
    mesh = jax.make_mesh((8,), ("x",))
    sharding = NamedSharding(mesh, P("x"))
    step = jax.jit(
        lambda state, x, n: state * 0.5 + x * n,
        static_argnums=2,
        donate_argnums=0,
        out_shardings=sharding,
    )
    state = jax.device_put(np.ones((8, 4), np.float32), sharding)
    x = jax.device_put(np.arange(32, dtype=np.float32).reshape(8, 4), sharding)
    _check_report(measure_call(step, (state, x, 3), {}, QUICK))
    # Each call got a new copy of the donated state: the caller's is still whole.
    assert not state.is_deleted()
    np.testing.assert_array_equal(state, np.ones((8, 4), np.float32))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_fastpjit_functions_pmap_aot_and_bound():
    stacked = jax.pmap(lambda v: v)(np.arange(32, dtype=np.float32).reshape(8, 4))
    _check_report(measure_call(fastpjit.pmap(scale, in_axes=(0, None)), (stacked, 2.0), {}, QUICK))
    x = jnp.ones(4)
    _check_report(measure_call(fastpjit.jit(scale).lower(x, 2.0).compile(), (x, 2.0), {}, QUICK))
    params = {f"w{i}": jnp.full(4, i, jnp.float32) for i in range(10)}
    bound = fastpjit.jit(lambda p, v: jax.tree.map(lambda w: w * v, p)).bind(params)
    assert _check_report(measure_call(bound, (x,), {}, QUICK))["name"].endswith("bound")


@pytest.mark.timeout(120)
def test_results_that_differ_fail_loudly():
    # A side channel: each trace bakes in the next number, so the sides compile different
    # programs.
    traces = itertools.count()

    def drifting(x):
        return x + next(traces)

    with pytest.raises(CheckFailed, match="disagree"):
        measure_call(drifting, (jnp.ones(4),), {}, QUICK)


def test_what_is_not_a_function_is_a_type_error():
    with pytest.raises(TypeError, match="fn must be a function.*got int"):
        fastpjit.benchmark(3, jnp.ones(4))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_plot_writes_a_png_and_without_matplotlib_says_what_to_install(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    result = measure_call(scale, (jnp.ones(4), 2.0), {}, QUICK)
    result.plot(tmp_path / "b.png")
    assert (tmp_path / "b.png").read_bytes().startswith(b"\x89PNG")
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"pip install fastpjit\[tools\]"):
        result.plot(tmp_path / "c.png")
    assert "fastpjit" in str(result)


def _figure_row(name, ours, theirs, floor, noise=(1.0, 0.98, 1.02, 0.99, 1.01)):
    """A row as `harness.measure` makes it, each side's rounds spread around its median."""
    sides = {"ours": ours, "jax": theirs} | ({} if floor is None else {"floor": floor})
    return {
        "name": name,
        "ours_us": ours,
        "jax_us": theirs,
        "floor_us": floor,
        "overhead_ratio": (ours - floor) / (theirs - floor)
        if floor is not None and theirs > floor
        else None,
        "stats": {side: {"per_round": [us * k for k in noise]} for side, us in sides.items()},
    }


def _png_size(path):
    header = path.read_bytes()[:24]
    assert header.startswith(b"\x89PNG")
    return int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")


def test_the_figure_is_one_line_per_row_on_one_screen(tmp_path):
    pytest.importorskip("matplotlib").use("Agg")
    import matplotlib.pyplot as plt

    rows = [_figure_row(f"row {i}", 9.0 + 0.1 * i, 12.0, 9.0) for i in range(21)]
    rows += [
        _figure_row("far above JAX", 30.0, 11.0, 10.0),
        _figure_row("no floor", 5.0, 6.0, None),
        _figure_row("JAX at the floor", 5.0, 4.0, 4.5),
    ]
    fig = harness.overhead_figure(rows, "24 rows")
    try:
        ax, right = fig.axes
        assert [t.get_text() for t in ax.get_yticklabels()] == [row["name"] for row in rows]
        labels = [t.get_text() for t in right.get_yticklabels()]
        assert labels[5] == "fastpjit +0.50, JAX +3 µs; floor 9"
        assert labels[-2].startswith("no floor") and labels[-1].endswith("floor 4.5")
        assert "overhead ratio = (fastpjit − floor) / (JAX − floor)" in ax.get_xlabel()
        # A line at 1, where fastpjit spends as much as JAX above the floor.
        assert any(list(line.get_xdata()) == [1, 1] for line in ax.get_lines())
        # One dot per row that has a ratio, on the row's line, at its ratio (clipped to the
        # axis, as an arrow, beyond it).
        dots = {
            int(line.get_ydata()[0]): (float(line.get_xdata()[0]), line.get_marker())
            for line in ax.get_lines()
            if len(line.get_xdata()) == 1
        }
        assert sorted(dots) == list(range(22))
        assert dots[5] == (pytest.approx(0.5 / 3), "o")
        assert dots[21] == (harness.RATIO_LIMITS[1], ">")
    finally:
        plt.close(fig)
    harness.overhead_plot(rows, tmp_path / "bench.png", "24 rows")
    width, height = _png_size(tmp_path / "bench.png")
    assert height <= 1200 and width <= 1400, (width, height)
    harness.overhead_plot(rows[:1], tmp_path / "one.png", "one row")
    assert _png_size(tmp_path / "one.png")[1] <= 300


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.timeout(240)
def test_the_bench_command_writes_its_json_and_plot(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # it asks for 8 devices
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "fastpjit.bench",
            "--quick",
            "--only",
            r"^jit, 1 dev: f\(x\)$",
            "--out",
            str(tmp_path),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=220,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "8 × cpu" in done.stdout and "load average" in done.stdout
    payload = json.loads((tmp_path / "bench.json").read_text())
    assert [row["name"] for row in payload["rows"]] == ["jit, 1 dev: f(x)"]
    assert payload["failures"] == {}
    assert payload["environment"]["device_count"] == 8
    row = payload["rows"][0]
    assert row["ours_us"] > 0 and row["jax_us"] > 0 and row["floor_us"] > 0
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (tmp_path / "bench.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.subprocess
def test_the_bench_command_rejects_a_pattern_that_matches_nothing(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "fastpjit.bench", "--only", "no such row", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "no row matches 'no such row'" in done.stderr


@pytest.mark.timeout(120)
def test_a_call_without_a_floor_is_timed_on_two_sides_and_says_why():
    def with_callback(x):
        jax.debug.callback(lambda: None)
        return x + 1

    result = measure_call(with_callback, (jnp.ones(4),), {}, QUICK)
    report = result.to_dict()
    assert set(report["sides"]) == {"fastpjit", "JAX"}
    assert report["overhead_ratio"] is None and report["speedup"] > 0
    assert "no fast path" in report["no_floor"]
    assert f"no floor: {report['no_floor']}" in str(result)


def test_a_case_takes_its_share_of_rounds_and_each_side_reports_its_thread_cpu():
    # The rows whose goals are finer than a round's spread take more rounds (benches/).
    case = harness.Case(name="more rounds", build=lambda: None, rounds_factor=2)
    settings = QUICK.for_case(case)
    assert (settings.rounds, settings.round_s) == (2 * QUICK.rounds, QUICK.round_s)
    assert QUICK.for_case(harness.Case(name="usual", build=lambda: None)) == QUICK
    x = jnp.ones(4)
    sides = harness.Sides(
        ours=lambda: x + 1, jax=lambda: x + 1, floor=lambda: x + 1, check=harness.same_result
    )
    row = harness.measure("more rounds", sides, settings)
    for side in ("ours", "jax", "floor"):
        stats = row["stats"][side]
        assert len(stats["per_round"]) == settings.rounds
        assert stats["thread_cpu"] >= 0 and stats["cpu"] >= 0


def test_a_paired_gap_is_the_median_of_each_round_s_gap_with_its_interval():
    # Round i: ours is floor + i, whatever the floor does between rounds.
    floors = [100.0 + 50 * (i % 3) for i in range(25)]
    row = {
        "stats": {
            "ours": {"per_round": [f + i for i, f in enumerate(floors)]},
            "floor": {"per_round": floors},
        }
    }
    median, low, high = harness.paired_gap(row, "ours", "floor")
    assert median == 12
    # The order statistics 2.5 · √25 ≈ 5 places either side of the middle one.
    assert (low, high) == (7, 17)
