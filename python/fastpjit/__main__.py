"""`python -m fastpjit run [-m] SCRIPT [ARGS]`: runs an unmodified program with fastpjit
installed in JAX's place (`fastpjit.install()`), as `python -m cProfile` runs one under the
profiler, and prints, at exit, what each function's calls did: calls, cache hits, misses,
compiles, and fallbacks with their reasons. The exit status is the program's."""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import traceback

import fastpjit
from fastpjit._stats import Stats

__all__ = ["main", "summary"]


def summary(stats: Stats | None = None) -> str:
    """`fastpjit.stats()` (or `stats`) per function, as a table, with each function's
    fallbacks and their reasons below it."""
    stats = fastpjit.stats() if stats is None else stats
    functions = stats["functions"]
    if not functions:
        return "fastpjit: no fastpjit function was called."
    headers = ("function", "calls", "hits", "misses", "compiles", "fallbacks")
    rows = [
        (
            name,
            *map(
                str,
                (
                    counts["calls"],
                    counts["cache_hits"],
                    counts["cache_misses"],
                    counts["compiles"],
                    sum(counts["fallbacks"].values()),
                ),
            ),
        )
        for name, counts in sorted(functions.items(), key=lambda f: -f[1]["calls"])
    ]
    widths = [max(len(row[i]) for row in (headers, *rows)) for i in range(len(headers))]

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(cells, widths, strict=True))
        )

    lines = ["fastpjit summary:", line(headers), *map(line, rows)]
    for name, counts in sorted(functions.items()):
        for reason, n in sorted(counts["fallbacks"].items(), key=lambda r: -r[1]):
            lines.append(f"  {name}: {n} × {reason}")
    return "\n".join(lines)


def _run(module: bool, target: str, args: list[str]) -> int:
    sys.argv = [target, *args]
    if not module:
        sys.path[0] = os.path.dirname(os.path.abspath(target))
    fastpjit.install()
    try:
        if module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
    except SystemExit as done:
        code = done.code
        if code is None or isinstance(code, int):
            return code or 0
        print(code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        print(summary(), file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fastpjit", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "run",
        help="run a program with fastpjit installed in JAX's place, and print what "
        "its functions' calls did at exit",
    )
    run.add_argument(
        "-m", dest="module", action="store_true", help="run a module by name, as python -m does"
    )
    run.add_argument("target", help="the script (or, with -m, the module) to run")
    run.add_argument("args", nargs=argparse.REMAINDER, help="the program's arguments")
    options = parser.parse_args(argv)
    return _run(options.module, options.target, options.args)


if __name__ == "__main__":
    sys.exit(main())
