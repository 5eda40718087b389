"""One side of the warm-start test of compile options per signature, in a process of its own.

`record PATH` registers options for the decode signature of `step`, serves a decode and a
prefill call and saves their signatures. `replay PATH HOW` makes `step` again (registering the
same options for decode: `register`; none: `adopt`; others: `conflict`), warms up from the
record, then makes the same calls. Prints one JSON line: whether the results equal jax.jit's,
the hits and misses of the calls, the warm-up's skipped reasons, and whether the executable
that served each call has the optimized HLO of jax.jit with that call's options.
"""

import json
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np

import fastpjit

# Off for decode only: XLA's algebraic simplifier, whose work shows in the optimized HLO.
DECODE_OPTIONS = {"xla_disable_hlo_passes": "algsimp"}
OTHER_OPTIONS = {"xla_disable_hlo_passes": ""}
W = np.full((8, 8), 0.5, np.float32)
DECODE = np.ones((1, 8), np.float32)
PREFILL = np.ones((16, 8), np.float32)


def step(w, x):
    return jnp.tanh(x @ w) * 2.0 * 3.0


# The Python stack frames that HLO metadata records: where the function was traced from.
_STACK_FRAMES = re.compile(r"^(\d+ .*|FileNames|FunctionNames|FileLocations|StackFrames)$")


def without_stack_frames(text):
    text = re.sub(r",? stack_frame_id=\d+", "", text)
    return "\n".join(line for line in text.splitlines() if not _STACK_FRAMES.match(line))


def executable_text(executable):
    """The optimized HLO of a loaded executable, as `jax.stages.Compiled.as_text` gives it,
    without stack frames."""
    if hasattr(executable, "get_hlo_text"):
        text = executable.get_hlo_text()
    else:
        text = "\n\n".join(m.to_string() for m in executable.hlo_modules())
    return without_stack_frames(text)


def jax_text(fun, options, *args):
    """The optimized HLO of jax.jit(fun, compiler_options=options) for these arguments."""
    compiled = jax.jit(fun, compiler_options=options).lower(*args).compile()
    return without_stack_frames(compiled.as_text())


def capture_executables():
    """The executables that fastpjit's jit misses compile, by the shape of the call's last
    argument: what each cache entry runs."""
    jit_module = sys.modules["fastpjit.jit"]
    miss = jit_module.jit_cache_miss
    captured = {}

    def capturing(jitted, args, kwargs, compiler_options=None):
        outcome = miss(jitted, args, kwargs, compiler_options)
        captured[np.shape(args[-1])] = executable_text(outcome.fast_path.executable)
        return outcome

    jit_module.jit_cache_miss = capturing
    return captured


def main():
    mode, path = sys.argv[1], sys.argv[2]
    captured = capture_executables()
    f = fastpjit.jit(step)
    skipped = None
    if mode == "record" or sys.argv[3] == "register":
        f.with_compiler_options(DECODE_OPTIONS, W, jax.ShapeDtypeStruct((1, 8), jnp.float32))
    elif sys.argv[3] == "conflict":
        f.with_compiler_options(OTHER_OPTIONS, W, DECODE)
    if mode == "replay":
        skipped = fastpjit.warm_up(path, {"step": f}).skipped()
        fastpjit.reset_stats()
    equal = [
        bool(np.array_equal(f(W, x), jax.jit(step)(W, x)))
        for x in (DECODE, PREFILL, DECODE, PREFILL)
    ]
    stats = fastpjit.stats()
    if mode == "record":
        fastpjit.save_signatures(path, {"step": f})
    print(
        json.dumps(
            {
                "equal": equal,
                "hits": stats["cache_hits"],
                "misses": stats["cache_misses"],
                "skipped": skipped,
                "decode_as_jax": captured.get((1, 8)) == jax_text(step, DECODE_OPTIONS, W, DECODE),
                "prefill_as_jax": captured.get((16, 8)) == jax_text(step, None, W, PREFILL),
            }
        )
    )


if __name__ == "__main__":
    main()
