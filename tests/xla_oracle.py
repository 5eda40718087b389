"""XLA's own verdict on HLO sharding text, asked of another process.

XLA's parser aborts the process on some texts (a failed CHECK, a division by zero), so tests
never hand it arbitrary text in their own process. A server process reads texts, one JSON line
each, forks a child per text that parses it with `xla_client.HloSharding.from_string`, and
answers what the child said, or that it crashed.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import threading

_SERVER = r"""
import json, os, resource, sys
from jaxlib import xla_client as xc

def vm_bytes():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0

def parse(text):
    # A child's address space is capped, so a sharding of 2**40 tiles fails to allocate
    # rather than taking the machine's memory.
    limit = vm_bytes() + (1 << 30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        sharding = xc.HloSharding.from_string(text)
        return {"ok": str(sharding)}
    except Exception as error:
        return {"error": f"{type(error).__name__}: {error}"}

for line in sys.stdin:
    text = json.loads(line)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        with os.fdopen(write, "w") as out:
            out.write(json.dumps(parse(text)))
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as answer:
        said = answer.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status) or os.WEXITSTATUS(status) != 0 or not said:
        said = json.dumps({"crash": f"wait status {status}"})
    sys.stdout.write(said + "\n")
    sys.stdout.flush()
"""


class XlaShardingOracle:
    """A server process; `verdict(text)` is `("ok", XLA's print of it)`, `("error", message)`
    or `("crash", how)`."""

    def __init__(self) -> None:
        env = {**os.environ, "JAX_PLATFORMS": "cpu"}
        self._process = subprocess.Popen(
            [sys.executable, "-c", _SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[str, str]] = {}

    def verdict(self, text: str) -> tuple[str, str]:
        with self._lock:
            if text not in self._cache:
                assert self._process.stdin is not None and self._process.stdout is not None
                self._process.stdin.write(json.dumps(text) + "\n")
                self._process.stdin.flush()
                line = self._process.stdout.readline()
                if not line:
                    raise RuntimeError("the XLA oracle process died")
                ((kind, said),) = json.loads(line).items()
                if len(self._cache) > 100_000:
                    self._cache.clear()
                self._cache[text] = (kind, said)
            return self._cache[text]

    def close(self) -> None:
        self._process.kill()
        self._process.wait()


_oracle: XlaShardingOracle | None = None


def xla_verdict(text: str) -> tuple[str, str]:
    """XLA's verdict on `text`, from a server started on first use and stopped at exit."""
    global _oracle
    if _oracle is None:
        _oracle = XlaShardingOracle()
        atexit.register(_oracle.close)
    return _oracle.verdict(text)
