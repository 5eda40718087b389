"""pmap and jit across processes: fastpjit against JAX, 2 processes × 4 CPU devices

`python benches/pmap_processes.py [--engine launch|srun|mpirun]` starts itself as 2 processes
with 4 CPU devices each: under `python -m fastpjit.launch` (the default), under `srun` on a
one-machine SLURM cluster that it starts for the run, or under Open MPI's `mpirun` (the
engines of `tests/cluster/engines.py`, installed from Debian's packages where missing). Each
process calls the same functions, pmap ones on host-local arguments (its own 4 rows), jit ones
on global arrays over both processes' devices, and process 0 reports. Every side makes the
same number of calls in every round, in the same order in both processes (a multi-process
executable runs only when every process launches it). The floor is the same executable run
raw on its inputs already placed (for pmap, global arrays made from the host-local ones), with
its global outputs. The rows with a collective, and the jit rows, wait for each result on
every side. Results are checked equal before timing.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROUNDS = 15
CALLS = 200


def _measure() -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import fastpjit
    from fastpjit._jax.jit_miss import jit_cache_miss
    from fastpjit.bench.floors import placed_inputs, runner

    jax.distributed.initialize()
    local = jax.local_device_count()
    rows = np.arange(local * 8, dtype=np.float32).reshape(local, 8) + 100 * jax.process_index()
    placed = jax.pmap(lambda v: v + 0)(rows)
    cases = [
        ("f(x), host-local array from a pmap", lambda v: v * 3, (placed,), {}, False),
        ("f(x), numpy rows", lambda v: v * 3, (rows,), {}, False),
        (
            "f(x, 1.5), in_axes=(0, None)",
            lambda v, s: v * s,
            (placed, 1.5),
            {"in_axes": (0, None)},
            False,
        ),
        (
            "psum across processes",
            lambda v: v / jax.lax.psum(v, "i"),
            (placed,),
            {"axis_name": "i"},
            True,
        ),
    ]
    report = []
    for name, fun, args, options, wait in cases:
        sides = _pmap_sides(fun, args, options)
        report.append((f"pmap {name}", _time(sides, wait)))
    mesh = jax.make_mesh((jax.device_count(),), ("d",))
    x = fastpjit.make_array_from_process_local_data(NamedSharding(mesh, P("d")), rows)
    jit_cases = [
        ("f(x), x sharded over both processes", lambda v: v * 3, (x,)),
        ("f(x, 1.5)", lambda v, s: v * s, (x, 1.5)),
        ("sum over both processes", lambda v: v / jnp.sum(v), (x,)),
    ]
    for name, fun, args in jit_cases:
        ours, theirs = fastpjit.jit(fun), jax.jit(fun)
        miss = jit_cache_miss(jax.jit(fun), args, {})
        run, inputs = runner(miss.fast_path), placed_inputs(miss.fast_path, list(args))
        sides = {
            "ours": lambda o=ours, a=args: o(*a),
            "jax": lambda t=theirs, a=args: t(*a),
            "floor": lambda r=run, i=inputs: r(i),
        }
        _check(sides)
        report.append((f"jit {name}", _time(sides, True)))
    if jax.process_index() == 0:
        print("| case | fastpjit µs | JAX µs | floor µs | speedup | overhead ratio |")
        print("|---|---:|---:|---:|---:|---:|")
        for name, m in report:
            ratio = (m["ours"] - m["floor"]) / (m["jax"] - m["floor"])
            print(
                f"| {name} | {m['ours']:.1f} | {m['jax']:.1f} | {m['floor']:.1f} | "
                f"{m['jax'] / m['ours']:.1f}× | {ratio:.2f} |",
                flush=True,
            )


def _check(sides) -> None:
    import jax
    import numpy as np

    expected = sides["jax"]()
    for side in ("ours", "floor"):
        got = sides[side]()
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
            assert a.sharding == b.sharding, (side, a.sharding, b.sharding)
            for sa, sb in zip(a.addressable_shards, b.addressable_shards, strict=True):
                assert np.array_equal(np.asarray(sa.data), np.asarray(sb.data)), side


def _time(sides, wait: bool) -> dict[str, float]:
    """Each side's median µs per call over the rounds, the sides' order rotating."""
    import jax

    times: dict[str, list[float]] = {side: [] for side in sides}
    for round_index in range(ROUNDS):
        order = list(sides)
        order = order[round_index % 3 :] + order[: round_index % 3]
        for side in order:
            call = sides[side]
            start = time.perf_counter_ns()
            for _ in range(CALLS):
                out = call()
                if wait:
                    jax.block_until_ready(out)
            jax.block_until_ready(out)
            times[side].append((time.perf_counter_ns() - start) / CALLS / 1e3)
    return {side: statistics.median(us) for side, us in times.items()}


def _pmap_sides(fun, args, options):
    """fastpjit.pmap, jax.pmap and the floor of `fun` on host-local `args`."""
    import jax
    import numpy as np

    import fastpjit
    from fastpjit._jax.jit_miss import pmap_cache_miss
    from fastpjit.bench.floors import placed_inputs, runner

    ours, theirs = fastpjit.pmap(fun, **options), jax.pmap(fun, **options)
    miss = pmap_cache_miss(jax.pmap(fun, **options), args, {})
    statics = options.get("static_broadcasted_argnums", ())
    dynamic = [a for i, a in enumerate(args) if i not in statics]
    global_args = [
        arg._rewrap_with_aval_and_sharding(*conversion)
        if isinstance(arg, jax.Array)
        else fastpjit.make_array_from_process_local_data(
            conversion[1], np.asarray(arg, conversion[0].dtype), conversion[0].shape
        )
        for arg, conversion in zip(jax.tree.leaves(dynamic), miss.fast_path.in_global, strict=True)
    ]
    run, inputs = runner(miss.fast_path), placed_inputs(miss.fast_path, global_args)
    expected = theirs(*args)
    for a, b in zip(jax.tree.leaves(ours(*args)), jax.tree.leaves(expected), strict=True):
        assert a.sharding == b.sharding and np.array_equal(np.asarray(a), np.asarray(b))
    return {
        "ours": lambda: ours(*args),
        "jax": lambda: theirs(*args),
        "floor": lambda: run(inputs),
    }


# How each engine labels what process 0 prints: the launcher and srun each line, mpirun each
# piece it relays (where a line's end may come apart from its start).
PROCESS_0 = {"launch": r"(?m)^\[0\] ", "srun": r"(?m)^0: ", "mpirun": r"\[\d+,0\]<stdout>:"}


def main() -> None:
    if os.environ.get("FASTPJIT_PMAP_PROCESSES_WORKER"):
        _measure()
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=sorted(PROCESS_0), default="launch")
    engine = parser.parse_args().engine
    os.environ["FASTPJIT_PMAP_PROCESSES_WORKER"] = "1"
    me = [sys.executable, "-u", __file__]
    slurm = None
    if engine == "launch":
        launch = [sys.executable, "-m", "fastpjit.launch", "--nproc", "2", "--local-devices"]
        command = [*launch, "4", "--timeout", "600", __file__]
    else:
        sys.path.insert(0, str(Path(__file__).parent.parent / "tests" / "cluster"))
        import engines

        engines.ensure_installed()
        if engine == "srun":
            slurm = engines.Slurm(Path(tempfile.mkdtemp(prefix="fastpjit-slurm-")))
            slurm.start()
            command = slurm.srun(me)
        else:
            command = engines.mpirun(me)
    try:
        env = slurm.env() if slurm is not None else None
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    finally:
        if slurm is not None:
            slurm.stop()
    # Process 0's table: its lines, labels taken out, that start a row.
    ours = re.sub(PROCESS_0[engine], "\n", done.stdout)
    table = [line.rstrip() for line in ours.splitlines() if line.startswith("|")]
    if done.returncode != 0 or not table:
        sys.exit(
            f"the run failed ({done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        )
    print(f"2 processes × 4 CPU devices, under {engine}:")
    print("\n".join(table))


if __name__ == "__main__":
    main()
