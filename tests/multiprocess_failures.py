"""Two-process runs that go wrong on purpose, for `test_multiprocess.py`: the launcher must stop
them. `python -m fastpjit.launch --nproc 2 ... tests/multiprocess_failures.py MODE`, where

- `killed`: process 1 kills itself (SIGKILL) during start-up;
- `raises`: process 1 raises;
- `waits`: process 1 waits for ever (until Ctrl-C);

while process 0 runs a collective over both processes' devices, which cannot finish.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import fastpjit


def main(mode: str) -> None:
    jax.distributed.initialize()
    print(f"ready pid {os.getpid()} pgid {os.getpgid(0)}", flush=True)
    if jax.process_index() == 1:
        time.sleep(1)  # process 0 is in its collective by now
        if mode in ("killed", "raises"):
            print(f"failing at {time.time():.3f}", flush=True)
        if mode == "killed":
            os.kill(os.getpid(), signal.SIGKILL)
        elif mode == "raises":
            raise ValueError("process 1 fails on purpose")
        time.sleep(3600)
    mesh = jax.make_mesh((8,), ("x",))
    x = fastpjit.make_array_from_process_local_data(
        NamedSharding(mesh, P("x")), np.ones(jax.local_device_count(), np.float32)
    )
    print("entering the collective", flush=True)
    total = fastpjit.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))(x)
    print(f"the collective finished: {float(total)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
