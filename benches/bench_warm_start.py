"""Warm starts: how long a fresh server takes to its first result in every shape bucket.

The workload is the decode step of `examples/serve.py` (a 2-layer transformer, tensor-parallel
over the 8 CPU devices), batched with vmap, over 8 KV-cache lengths (16, 24, ..., 72) and 2
batch sizes (1 and 4): 16 signatures. Each scenario runs in a fresh process and times the first
call of every bucket, after the parameters are placed:

- cold: nothing cached;
- persistent cache: JAX's persistent compilation cache holds every executable (filled by an
  untimed run before);
- replay: `fastpjit.warm_up` of a record saved by an earlier process, then the first calls;
- replay + persistent cache: both.

For the replays it reports the replay's own time too, and the cache hits and misses of the
first calls after it (all should be hits). Every scenario checks its tokens against the
cold run's.

    .venv/bin/python benches/bench_warm_start.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

LENGTHS = tuple(range(16, 80, 8))
BATCHES = (1, 4)


def _serve_module():
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    import serve

    return serve


def server(mode: str, record: str) -> dict:
    """One fresh process's start: place the weights, maybe warm up, then the first call of
    every bucket."""
    import jax
    import numpy as np
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    import fastpjit

    serve = _serve_module()
    mesh = jax.make_mesh((8,), ("model",), axis_types=(AxisType.Auto,))
    params = jax.device_put(serve.init_params(), serve.shardings(mesh))
    step = fastpjit.jit(jax.vmap(serve.decode_step, in_axes=(None, 0, None, 0)), donate_argnums=3)
    step.__name__ = "batched_decode_step"
    cache_sharding = NamedSharding(mesh, P(None, None, None, None, "model", None))
    shapes = [(b, n) for n in LENGTHS for b in BATCHES]
    replay_s = None
    if mode.startswith("replay"):
        began = time.perf_counter()
        report = fastpjit.warm_up(record, {"decode": step})
        replay_s = time.perf_counter() - began
        assert report.counts().get("skipped", 0) == 0, report.skipped()
    fastpjit.reset_stats()
    firsts, tokens = [], []
    began = time.perf_counter()
    for batch, length in shapes:
        cache = jax.device_put(
            np.zeros((batch, serve.LAYERS, 2, length, serve.HEADS, serve.HEAD), np.float32),
            cache_sharding,
        )
        token = np.arange(batch, dtype=np.int32) % serve.VOCAB
        start = time.perf_counter()
        out, _ = step(params, token, 0, cache)
        tokens.append(np.asarray(out).tolist())
        firsts.append(time.perf_counter() - start)
    total = time.perf_counter() - began
    stats = fastpjit.stats()
    if mode == "record":
        fastpjit.save_signatures(record, {"decode": step})
    return {
        "first_calls_s": total,
        "slowest_first_s": max(firsts),
        "replay_s": replay_s,
        "hits": stats["cache_hits"],
        "misses": stats["cache_misses"],
        "tokens": tokens,
    }


def _fresh(mode: str, record: str, cache_dir: str | None) -> dict:
    env = dict(os.environ)
    if cache_dir is not None:
        env.update(
            JAX_COMPILATION_CACHE_DIR=cache_dir,
            JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
            JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
        )
    done = subprocess.run(
        [sys.executable, __file__, "--server", mode, record],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{mode} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        record, cache_dir = os.path.join(tmp, "signatures.json"), os.path.join(tmp, "cache")
        recorded = _fresh("record", record, None)
        _fresh("cold", record, cache_dir)  # fills the persistent cache, untimed
        runs = {
            "cold": _fresh("cold", record, None),
            "persistent cache": _fresh("cold", record, cache_dir),
            "replay": _fresh("replay", record, None),
            "replay + persistent cache": _fresh("replay", record, cache_dir),
        }
    print(
        f"{len(LENGTHS)} cache lengths x {len(BATCHES)} batch sizes = "
        f"{len(LENGTHS) * len(BATCHES)} buckets; fresh process each, 8 CPU devices"
    )
    print(
        f"{'':28}{'to every first result':>22}{'of which replay':>16}{'slowest first':>15}"
        f"{'hits/misses':>13}"
    )
    for name, run in runs.items():
        assert run["tokens"] == recorded["tokens"], f"{name} decoded other tokens"
        replay = run["replay_s"] or 0.0
        print(
            f"{name:28}{run['first_calls_s'] + replay:20.2f} s{replay:14.2f} s"
            f"{run['slowest_first_s'] * 1e3:12.1f} ms{run['hits']:>8}/{run['misses']}"
        )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--server"]:
        print(json.dumps(server(sys.argv[2], sys.argv[3])))
    else:
        main()
