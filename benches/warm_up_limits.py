"""What a hostile warm-start record costs `warm_up` under its default limits
(`python benches/warm_up_limits.py`): each record replayed in a fresh process, with its peak
RSS, its time, and what the report says.

- memory: one signature of a (2**40,) float32 numpy argument (4 TiB of zeros; a few hundred
  bytes of JSON), within the dims that a record may hold;
- replicated: one signature of an (2**26,) float32 array replicated over 8 devices (256 MiB
  each, 2 GiB in all: at the limit);
- count: 100,000 signatures of one function, each of another shape.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TQDM_DISABLE", "1")  # no progress bar in the output

RECORDS = ("memory", "replicated", "count")


def record(kind: str) -> dict:
    from fastpjit import warm_start

    def numpy(shape):
        return {"leaf": {"kind": "numpy", "shape": list(shape), "dtype": "float32"}}

    config = {"jax_enable_x64": False, "mesh": None}
    if kind == "memory":
        signatures = [{"args": [numpy([1 << 40])], "kwargs": {}, "config": config}]
    elif kind == "replicated":
        leaf = {
            "leaf": {
                "kind": "array",
                "shape": [1 << 26],
                "dtype": "float32",
                "weak_type": False,
                "committed": True,
                "sharding": {
                    "type": "named",
                    "mesh_shape": [8],
                    "axis_names": ["x"],
                    "axis_types": ["Auto"],
                    "device_ids": list(range(8)),
                    "spec": [None],
                    "memory_kind": None,
                },
            }
        }
        signatures = [{"args": [leaf], "kwargs": {}, "config": config}]
    else:
        signatures = [
            {"args": [numpy([n])], "kwargs": {}, "config": config} for n in range(1, 100_001)
        ]
    return {
        "schema": warm_start.SCHEMA,
        "schema_version": warm_start.SCHEMA_VERSION,
        "versions": warm_start.schema.versions(),
        "functions": {"f": {"unrecordable": {}, "signatures": signatures}},
    }


def replay(kind: str, path: str) -> None:
    import fastpjit

    with open(path, "w") as out:
        json.dump(record(kind), out)
    size = os.path.getsize(path)
    f = fastpjit.jit(lambda x: x.sum())
    began = time.perf_counter()
    report = fastpjit.warm_up(path, {"f": f})
    seconds = time.perf_counter() - began
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    skipped = {reason[:70]: n for reason, n in report.skipped().items()}
    print(
        json.dumps(
            {
                "record": kind,
                "record_bytes": size,
                "seconds": round(seconds, 2),
                "peak_rss_mib": round(rss),
                "counts": report.counts(),
                "skipped": skipped,
            }
        )
    )


def main() -> None:
    if len(sys.argv) == 3:
        replay(sys.argv[1], sys.argv[2])
        return
    with tempfile.TemporaryDirectory() as folder:
        for kind in RECORDS:
            path = os.path.join(folder, f"{kind}.json")
            subprocess.run([sys.executable, __file__, kind, path], check=True)


if __name__ == "__main__":
    main()
