"""`python -m fastpjit run [-m] SCRIPT [ARGS]`: runs an unmodified program with fastpjit
installed in JAX's place (`fastpjit.install()`), as `python -m cProfile` runs one under the
profiler, and prints, at exit, what each function's calls did: calls, cache hits, misses,
compiles, and fallbacks with their reasons. It ends as `python SCRIPT` would: the program's
exit status, its `sys.excepthook` shown its own frames, status 2 for a script that is not there,
and death by SIGINT (a shell's 130) on an uncaught Ctrl-C."""

from __future__ import annotations

import argparse
import importlib.util
import os
import runpy
import sys
from types import TracebackType

import fastpjit
from fastpjit._core import fallback_reasons
from fastpjit._stats import Stats

__all__ = ["main", "summary"]


def summary(stats: Stats | None = None) -> str:
    """`fastpjit.stats()` (or `stats`) per function, as a table, with each function's
    fallbacks and their reasons below it."""
    stats = fastpjit.stats() if stats is None else stats
    functions = stats["functions"]
    if not functions:
        return "fastpjit: no fastpjit function was called."
    # Each call is in one of hits, misses, fallbacks (JAX ran it) and in traces.
    headers = ("function", "calls", "hits", "misses", "fallbacks", "in traces", "compiles")
    rows = [
        (
            name,
            *map(
                str,
                (
                    counts["calls"],
                    counts["cache_hits"],
                    counts["cache_misses"],
                    counts["jax_calls"],
                    counts["traced"],
                    counts["compiles"],
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
    texts = fallback_reasons()
    for name, counts in sorted(functions.items()):
        for code, n in sorted(counts["fallbacks"].items(), key=lambda r: -r[1]):
            lines.append(f"  {name}: {n} × {code}: {texts.get(code, code)}")
    return "\n".join(lines)


class _Interrupted(Exception):
    """A program that an uncaught Ctrl-C ended, whose traceback its hook has shown."""


# The files of the frames between python and the program: this runner's and runpy's.
_RUNNER_FILES = frozenset((__file__, runpy.run_path.__code__.co_filename))


def _program_frames(traceback: TracebackType | None) -> TracebackType | None:
    """`traceback` from the program's first frame, as `python SCRIPT` would show it."""
    while traceback is not None and traceback.tb_frame.f_code.co_filename in _RUNNER_FILES:
        traceback = traceback.tb_next
    return traceback


def _missing(module: bool, target: str) -> tuple[str, int] | None:
    """What python says, and its exit status, where the program to run is not there."""
    if module:
        try:
            found = importlib.util.find_spec(target)
        except ImportError as error:
            return (
                f"{sys.executable}: Error while finding module specification for {target!r} "
                f"({type(error).__name__}: {error})",
                1,
            )
        return None if found is not None else (f"{sys.executable}: No module named {target}", 1)
    if os.path.isdir(target):
        return None
    try:
        open(target, "rb").close()
    except OSError as error:
        return (
            f"{sys.executable}: can't open file {os.path.abspath(target)!r}: "
            f"[Errno {error.errno}] {error.strerror}",
            2,
        )
    return None


def _install_in_children() -> None:
    """Makes the Python processes that the program starts (multiprocessing's workers with
    every start method, other Python programs) install fastpjit too: see
    `fastpjit/_children/sitecustomize.py`."""
    folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_children")
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([folder, path] if path else [folder])
    os.environ["FASTPJIT_INSTALL"] = "1"


def _run(module: bool, target: str, args: list[str], children: bool = True) -> int:
    missing = _missing(module, target)
    if missing is not None:
        message, status = missing
        print(message, file=sys.stderr)
        return status
    sys.argv = [target, *args]
    if not module:
        sys.path[0] = os.path.dirname(os.path.abspath(target))
    fastpjit.install()
    if children:
        _install_in_children()
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
    except BaseException as error:
        # Python's own hook shows the error's traceback, not the one it is given.
        program_frames = _program_frames(error.__traceback__)
        sys.excepthook(type(error), error.with_traceback(program_frames), program_frames)
        if isinstance(error, KeyboardInterrupt):
            raise _Interrupted from None
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
        usage="python -m fastpjit run [-h] [--this-process] [-m] target [args ...]",
        help="run a program with fastpjit installed in JAX's place, and print what "
        "its functions' calls did at exit",
    )
    run.add_argument(
        "--this-process",
        action="store_true",
        help="install fastpjit in this process only, not in the Python processes that the "
        "program starts (its multiprocessing workers, say)",
    )
    run.add_argument(
        "-m", dest="module", action="store_true", help="run a module by name, as python -m does"
    )
    run.add_argument("target", help="the script (or, with -m, the module) to run")
    run.add_argument(
        "args", nargs=argparse.REMAINDER, metavar="[args ...]", help="the program's arguments"
    )
    options = parser.parse_args(argv)
    return _run(options.module, options.target, options.args, not options.this_process)


if __name__ == "__main__":
    try:
        status = main()
    except _Interrupted:
        # As python ends on an uncaught Ctrl-C: exit handlers, then death by SIGINT. The
        # program's hook has shown the traceback already.
        sys.excepthook = lambda *exception: None
        raise KeyboardInterrupt from None
    sys.exit(status)
