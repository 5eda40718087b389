"""`python -m fastpjit.bench [--quick] [--only PATTERN] [--out DIR]`: the standard dispatch
suite, for people to run and share (see `_DESCRIPTION`)."""

from __future__ import annotations

import os
import re

# Where JAX has only the CPU, 8 devices, so that the sharded rows have devices to shard over.
# (XLA reads the flag when JAX first starts a backend, which importing fastpjit does not; the
# flag means nothing to other platforms.)
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Iterable, Iterator  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, TypeVar  # noqa: E402

from fastpjit.bench import harness, suite  # noqa: E402

T = TypeVar("T")
_DESCRIPTION = """The standard dispatch suite on this machine's default devices (8 CPU devices
where there is no accelerator): each row times fastpjit, JAX and the floor in one interleaved
run, after checking their results equal; the run prints a table and writes bench.json and
bench.png into DIR. bench.png has a line per row: its overhead ratio (fastpjit − floor) / (JAX
− floor) against a line at 1 (as JAX), and each side's µs above the floor."""


def _progress(items: list[T]) -> Iterable[T]:
    """A tqdm bar over `items` where tqdm is installed, a line per item otherwise."""
    try:
        from tqdm import tqdm  # type: ignore[import-untyped]
    except ImportError:
        return _lines(items)
    bar: Iterable[T] = tqdm(items, file=sys.stderr, unit="case", dynamic_ncols=True)
    return bar


def _lines(items: list[T]) -> Iterator[T]:
    for i, item in enumerate(items, 1):
        print(f"[{i}/{len(items)}] {getattr(item, 'name', item)}", file=sys.stderr, flush=True)
        yield item


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fastpjit.bench", description=_DESCRIPTION)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a row of each kind, with short rounds (under two minutes)",
    )
    parser.add_argument(
        "--only",
        metavar="PATTERN",
        help="only the rows whose name contains PATTERN (a regular expression, case-insensitive)",
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        default="fastpjit-bench",
        help="where to write bench.json and bench.png (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    start = time.perf_counter()

    env = harness.environment()
    print(f"fastpjit.bench on {harness.describe(env)}", flush=True)
    cases = suite.cases(quick=args.quick and args.only is None)
    if args.only is not None:
        pattern = re.compile(args.only, re.IGNORECASE)
        cases = [case for case in cases if pattern.search(case.name)]
        if not cases:
            parser.error(f"no row matches {args.only!r}")
    settings = suite.settings(args.quick)
    rows: list[dict[str, Any]] = []
    failures: dict[str, str] = {}
    for case in _progress(cases):
        try:
            rows.append(case.meta | harness.measure(case.name, case.build(), settings))
        except Exception as err:  # one row's failure is reported, and the others still run
            failures[case.name] = "".join(traceback.format_exception_only(err)).strip()
            print(f"\n{case.name}: FAILED\n{traceback.format_exc()}", file=sys.stderr)

    if rows:
        print("\n" + harness.text_table(rows))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    payload = {
        "environment": env,
        "command": " ".join(["python -m fastpjit.bench", *(argv or sys.argv[1:])]),
        "quick": args.quick,
        "settings": vars(settings),
        "rows": rows,
        "failures": failures,
    }
    (out / "bench.json").write_text(json.dumps(payload, indent=1, default=str))
    written = [out / "bench.json"]
    if rows:
        try:
            harness.overhead_plot(
                rows,
                out / "bench.png",
                f"fastpjit, JAX and the floor on {env['device_count']} × "
                f"{env['device_kind']}, fastpjit {env['fastpjit']}",
            )
            written.append(out / "bench.png")
        except ImportError as err:
            print(f"no plot: {err}", file=sys.stderr)
    print(f"\nwrote {', '.join(map(str, written))} in {time.perf_counter() - start:.0f} s")
    for name, error in failures.items():
        print(f"FAILED {name}: {error}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
