"""A serving loop: a small decoder-only transformer answering requests from a queue.

Four worker threads take requests (a prompt token each) from a queue and decode `--tokens`
tokens for each, one token per step, with the step's KV cache donated. The weights are
random, tensor-parallel over a mesh of the 8 CPU devices (`--devices 8`, sharded with
NamedSharding over the heads and the MLP) or on one device (`--devices 1`). The decode step
runs three ways, interleaved request by request: a bound function (`fastpjit.jit(step).bind(
params)`, the parameters resident), plain `fastpjit.jit(step)(params, ...)`, and
`jax.jit(step)(params, ...)`. At the end it checks that all three produced the same tokens,
prints p50/p90/p99 step latency and tokens/s for each, and saves a latency histogram.

Warm starts: `--record PATH` saves the signatures that the fastpjit functions served, and a
later run with `--warm-up PATH` compiles them before it takes requests, so that its first
request is served from the cache (`fastpjit.save_signatures`, `fastpjit.warm_up`).

    make serve                       # or: .venv/bin/python examples/serve.py --devices 8
    .venv/bin/python examples/serve.py --record signatures.json
    .venv/bin/python examples/serve.py --warm-up signatures.json
"""

from __future__ import annotations

import argparse
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import fastpjit  # noqa: E402

VOCAB, MODEL, HEADS, LAYERS, MAX_LEN = 256, 128, 8, 2, 64
HEAD = MODEL // HEADS
WORKERS = 4


def init_params(seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)

    def dense(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

    layers = [
        {
            "wq": dense(MODEL, MODEL),
            "wk": dense(MODEL, MODEL),
            "wv": dense(MODEL, MODEL),
            "wo": dense(MODEL, MODEL),
            "w1": dense(MODEL, 4 * MODEL),
            "w2": dense(4 * MODEL, MODEL),
        }
        for _ in range(LAYERS)
    ]
    return {"embed": dense(VOCAB, MODEL), "layers": layers, "unembed": dense(MODEL, VOCAB)}


def shardings(mesh: Any) -> dict[str, Any]:
    """Tensor parallelism: attention by heads, the MLP by its hidden units."""
    columns, rows, whole = (
        NamedSharding(mesh, P(None, "model")),
        NamedSharding(mesh, P("model", None)),
        NamedSharding(mesh, P()),
    )
    layer = {"wq": columns, "wk": columns, "wv": columns, "wo": rows, "w1": columns, "w2": rows}
    return {"embed": whole, "layers": [layer] * LAYERS, "unembed": whole}


def new_cache(mesh: Any | None, length: int = MAX_LEN) -> jax.Array:
    # From numpy: jnp.zeros would compile a program of JAX's own on a server's first request.
    cache = np.zeros((LAYERS, 2, length, HEADS, HEAD), np.float32)
    if mesh is None:
        return jax.device_put(cache, jax.devices()[0])
    return jax.device_put(cache, NamedSharding(mesh, P(None, None, None, "model", None)))


def decode_step(params: dict[str, Any], token: Any, position: Any, cache: Any) -> Any:
    """One token through the model: the next token (greedy) and the updated KV cache, whose
    length is the request's bucket."""
    x = params["embed"][token]
    mask = jnp.arange(cache.shape[2]) <= position
    for i, layer in enumerate(params["layers"]):
        q = (x @ layer["wq"]).reshape(HEADS, HEAD)
        k = (x @ layer["wk"]).reshape(HEADS, HEAD)
        v = (x @ layer["wv"]).reshape(HEADS, HEAD)
        cache = cache.at[i, 0, position].set(k).at[i, 1, position].set(v)
        scores = jnp.einsum("hd,thd->ht", q, cache[i, 0]) / np.sqrt(HEAD)
        weights = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
        attended = jnp.einsum("ht,thd->hd", weights, cache[i, 1]).reshape(MODEL)
        x = x + attended @ layer["wo"]
        x = x + jax.nn.gelu(x @ layer["w1"]) @ layer["w2"]
    return jnp.argmax(x @ params["unembed"]).astype(jnp.int32), cache


def serve(
    step: Any, requests: list[int], tokens: int, mesh: Any | None, progress: Any
) -> tuple[dict[int, list[int]], list[float]]:
    """Decodes `tokens` tokens for each request on `WORKERS` threads: the tokens of each
    request, and every step's latency in seconds."""
    work: queue.Queue[tuple[int, int]] = queue.Queue()
    for i, prompt in enumerate(requests):
        work.put((i, prompt))
    answers: dict[int, list[int]] = {}
    latencies: list[float] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker() -> None:
        try:
            work_through()
        except BaseException as err:  # noqa: BLE001  (raised again by the caller)
            errors.append(err)

    def work_through() -> None:
        while True:
            try:
                i, token = work.get_nowait()
            except queue.Empty:
                return
            cache, out, mine = new_cache(mesh), [], []
            for position in range(tokens):
                start = time.perf_counter()
                next_token, cache = step(token, position, cache)
                token = int(next_token)  # the server reads each token: the step is done
                mine.append(time.perf_counter() - start)
                out.append(token)
            with lock:
                answers[i] = out
                latencies.extend(mine)
            progress.update(1)

    threads = [threading.Thread(target=worker) for _ in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return answers, latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, choices=(1, 8), default=8)
    parser.add_argument("--requests", type=int, default=24, help="requests per way")
    parser.add_argument("--tokens", type=int, default=24, help="tokens decoded per request")
    parser.add_argument("--out", default="serve_latency.png", help="the histogram's file")
    parser.add_argument(
        "--record",
        metavar="PATH",
        help="save the signatures served to PATH (fastpjit.save_signatures)",
    )
    parser.add_argument(
        "--warm-up", metavar="PATH", help="compile the signatures saved in PATH before serving"
    )
    args = parser.parse_args()

    mesh = None
    if args.devices > 1:  # XLA propagates the weights' shardings through the step
        mesh = jax.make_mesh((args.devices,), ("model",), axis_types=(AxisType.Auto,))
    params = init_params()
    params = jax.device_put(params, shardings(mesh) if mesh is not None else jax.devices()[0])
    donate = {"donate_argnums": 3}
    bound = fastpjit.jit(decode_step, **donate).bind(params)
    plain = fastpjit.jit(decode_step, **donate)
    theirs = jax.jit(decode_step, **donate)
    ways = {
        "fastpjit bound": bound,
        "fastpjit.jit": lambda *a: plain(params, *a),
        "jax.jit": lambda *a: theirs(params, *a),
    }
    # The names under which the record keeps the functions' signatures.
    recorded = {"decode_step": plain}

    rng = np.random.default_rng(1)
    requests = [int(t) for t in rng.integers(0, VOCAB, args.requests)]
    if args.warm_up:
        report = fastpjit.warm_up(args.warm_up, recorded)
        print(f"warm_up: {report.counts()} in {report.seconds:.2f} s")
    fastpjit.reset_stats()
    began = time.perf_counter()
    serve(bound, requests[:1], 2, mesh, _NoProgress())
    print(
        f"first request's two tokens, fastpjit bound: {time.perf_counter() - began:.3f} s, "
        f"{fastpjit.stats()['cache_misses']} cache misses"
    )
    for step in ways.values():  # compile outside the timing
        serve(step, requests[:1], 2, mesh, _NoProgress())
    answers: dict[str, dict[int, list[int]]] = {name: {} for name in ways}
    latencies: dict[str, list[float]] = {name: [] for name in ways}
    elapsed = dict.fromkeys(ways, 0.0)
    with _progress(total=len(ways) * len(requests), unit="request") as progress:
        # Interleaved: each way serves a slice of the requests in turn.
        for start in range(0, len(requests), WORKERS):
            chunk = requests[start : start + WORKERS]
            for name, step in ways.items():
                began = time.perf_counter()
                got, times = serve(step, chunk, args.tokens, mesh, progress)
                elapsed[name] += time.perf_counter() - began
                answers[name].update({start + i: toks for i, toks in got.items()})
                latencies[name].extend(times)
    first = next(iter(answers.values()))
    for name, got in answers.items():
        assert got == first, f"{name} decoded other tokens than {next(iter(answers))}"
    print(
        f"{len(requests)} requests × {args.tokens} tokens on {args.devices} device(s), "
        f"{WORKERS} worker threads: every way decoded the same tokens."
    )
    print(f"{'':16} {'p50 µs':>8} {'p90 µs':>8} {'p99 µs':>8} {'tokens/s':>9}")
    for name, times in latencies.items():
        p50, p90, p99 = np.percentile(np.array(times) * 1e6, [50, 90, 99])
        rate = len(times) / elapsed[name]
        print(f"{name:16} {p50:8.0f} {p90:8.0f} {p99:8.0f} {rate:9.0f}")
    _histogram(latencies, args.out, args.devices)
    if args.record:
        fastpjit.save_signatures(args.record, recorded)
        print(f"signatures served: {Path(args.record).resolve()}")


class _NoProgress:
    def update(self, n: int) -> None:
        pass


def _progress(total: int, unit: str) -> Any:
    try:
        from tqdm import tqdm
    except ImportError:
        print("(pip install 'fastpjit[tools]' for a progress bar)")
        import contextlib

        return contextlib.nullcontext(_NoProgress())
    return tqdm(total=total, unit=unit)


def _histogram(latencies: dict[str, list[float]], out: str, devices: int) -> None:
    try:
        import matplotlib
    except ImportError:
        print("(pip install 'fastpjit[tools]' for the latency histogram)")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    every = np.concatenate([np.array(t) * 1e6 for t in latencies.values()])
    bins = np.geomspace(max(every.min(), 1.0), every.max(), 60)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, times in latencies.items():
        ax.hist(np.array(times) * 1e6, bins=bins, histtype="step", linewidth=1.5, label=name)
    ax.set_xscale("log")
    ax.set_xlabel("decode step latency (µs)")
    ax.set_ylabel("steps")
    ax.set_title(f"Decode step latency, {devices} device(s), {WORKERS} worker threads")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"latency histogram: {Path(out).resolve()}")


if __name__ == "__main__":
    main()
