"""The call-pattern matrix: `fastpjit.jit`/`pmap` against `jax.jit`/`pmap` on the calls people write

The rows are `fastpjit.bench.calls`'s (shared with `python -m fastpjit.bench`), on 1 and 8
devices.
"""

from __future__ import annotations

import statistics
from typing import Any

from fastpjit.bench import calls

# BENCHMARKS.md takes its title from the docstring's first line and its introduction from the
# rest: the matrix's own description of its rows.
__doc__ = f"{(__doc__ or '').splitlines()[0]}\n\n{(calls.__doc__ or '').split(chr(10) * 2, 1)[1]}"
COLUMNS = ("kind", "devices")
CASES = calls.cases(widths=(1, 8), process_devices=8)


def _noise(row: dict[str, Any]) -> str:
    """fastpjit/JAX of a row, with the spread of its rounds' ratios."""
    ratios = [
        ours / theirs
        for ours, theirs in zip(
            row["stats"]["ours"]["per_round"], row["stats"]["jax"]["per_round"], strict=True
        )
        if theirs > 0
    ]
    if len(ratios) < 2:
        return f"{row['ours_us'] / row['jax_us']:.2f}×"
    low, _, high = statistics.quantiles(ratios, n=4)
    slower = sum(r > 1 for r in ratios)
    return (
        f"{row['ours_us'] / row['jax_us']:.2f}×, rounds {low:.2f}–{high:.2f}×, "
        f"slower in {slower} of {len(ratios)}"
    )


def notes(rows: list[dict[str, Any]], processes: Any) -> str:
    """The issue's goals, measured."""
    lines = [
        "**Goals** (issue 12): every row at most 1.0× JAX's time; 8-thread calls/s at least JAX's."
    ]
    slower = [row for row in rows if row["ours_us"] > row["jax_us"]]
    worst = max(rows, key=lambda row: row["ours_us"] / row["jax_us"])
    lines.append(
        f"- Rows where fastpjit took longer than JAX: {len(slower)} of {len(rows)}"
        + (": " + "; ".join(f"{row['name']} ({_noise(row)})" for row in slower) if slower else "")
        + f". Highest fastpjit/JAX: {worst['ours_us'] / worst['jax_us']:.2f}× "
        f"({worst['name']})."
    )
    lines.append(
        "  Noise: each round times every side back to back, so fastpjit/JAX is also "
        "taken round by round; in parentheses, the median ratio, the middle half of "
        "the rounds' ratios, and how many rounds fastpjit took longer."
    )
    threads = {row["name"].rsplit(" on ", 1)[1]: row for row in rows if row["kind"] == "threads"}
    one = threads.get("1 thread")
    if one is not None:
        for label, row in threads.items():
            ours = 1e6 / row["ours_us"]
            theirs = 1e6 / row["jax_us"]
            lines.append(
                f"- f(x) on {label}: fastpjit {ours:,.0f} calls/s "
                f"({one['ours_us'] / row['ours_us']:.2f}× its 1-thread rate), JAX "
                f"{theirs:,.0f} calls/s ({one['jax_us'] / row['jax_us']:.2f}×)."
            )
    return "\n".join(lines)
