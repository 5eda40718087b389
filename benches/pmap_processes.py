"""pmap across processes: `fastpjit.pmap` against `jax.pmap`, 2 processes × 4 CPU devices

`python benches/pmap_processes.py` starts itself under `python -m fastpjit.launch --nproc 2
--local-devices 4`; each process calls the same functions on host-local arguments (its own 4
rows), and process 0 reports. Every side makes the same number of calls in every round, in
the same order in both processes (a multi-process executable runs only when every process
launches it). The floor is the same executable run raw on global arrays already made from the
host-local ones, with its global outputs (no conversion to host-local arrays). Rows with a
collective wait for each result on every side. Results are checked equal before timing.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

ROUNDS = 15
CALLS = 200


def _measure() -> None:
    import jax
    import numpy as np

    import fastpjit
    from fastpjit._jax.jit_miss import pmap_cache_miss
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
        ours, theirs = fastpjit.pmap(fun, **options), jax.pmap(fun, **options)
        miss = pmap_cache_miss(jax.pmap(fun, **options), args, {})
        statics = options.get("static_broadcasted_argnums", ())
        dynamic = [a for i, a in enumerate(args) if i not in statics]
        in_global = miss.fast_path.in_global
        global_args = [
            arg._rewrap_with_aval_and_sharding(*conversion)
            if isinstance(arg, jax.Array)
            else fastpjit.make_array_from_process_local_data(
                conversion[1], np.asarray(arg, conversion[0].dtype), conversion[0].shape
            )
            for arg, conversion in zip(jax.tree.leaves(dynamic), in_global, strict=True)
        ]
        run = runner(miss.fast_path)
        inputs = placed_inputs(miss.fast_path, global_args)
        sides = {
            "ours": lambda o=ours, a=args: o(*a),
            "jax": lambda t=theirs, a=args: t(*a),
            "floor": lambda r=run, i=inputs: r(i),
        }
        expected = theirs(*args)
        for a, b in zip(jax.tree.leaves(ours(*args)), jax.tree.leaves(expected), strict=True):
            assert a.sharding == b.sharding and np.array_equal(np.asarray(a), np.asarray(b))
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
        medians = {side: statistics.median(us) for side, us in times.items()}
        report.append((name, medians))
    if jax.process_index() == 0:
        print("| case | fastpjit µs | jax.pmap µs | floor µs | speedup | overhead ratio |")
        print("|---|---:|---:|---:|---:|---:|")
        for name, m in report:
            ratio = (m["ours"] - m["floor"]) / (m["jax"] - m["floor"])
            print(
                f"| {name} | {m['ours']:.1f} | {m['jax']:.1f} | {m['floor']:.1f} | "
                f"{m['jax'] / m['ours']:.1f}× | {ratio:.2f} |",
                flush=True,
            )


def main() -> None:
    if os.environ.get("FASTPJIT_PMAP_PROCESSES_WORKER"):
        _measure()
        return
    command = [
        sys.executable,
        "-m",
        "fastpjit.launch",
        "--nproc",
        "2",
        "--local-devices",
        "4",
        "--timeout",
        "600",
        __file__,
    ]
    env = dict(os.environ, FASTPJIT_PMAP_PROCESSES_WORKER="1")
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    table = [
        line.split("] ", 1)[1] for line in done.stdout.splitlines() if line.startswith("[0] |")
    ]
    if done.returncode != 0 or not table:
        sys.exit(
            f"the run failed ({done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        )
    print("\n".join(table))


if __name__ == "__main__":
    main()
