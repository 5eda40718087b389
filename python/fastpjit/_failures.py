"""How a process of a multi-process JAX program ends when it fails, under any engine (the
launcher, `srun`, `mpirun`, a Kubernetes Job): at once, so that the engine ends the job.

After `jax.distributed.initialize()`, a failing process would not end by itself:

- an uncaught exception leaves it in JAX's exit handler, which waits in the coordination
  service's shutdown barrier for peers that may be waiting on it in a collective (a
  two-process job on gloo had not ended 200 s later, under `srun` or `mpirun`);
- SIGTERM, with which SLURM (`--kill-on-bad-exit`, `scancel`) and `mpirun` stop the other
  processes of a failed job, is taken by JAX's preemption notifier, which only notes it; SLURM
  kills the process after its `KillWait` (30 s by default).

So, once fastpjit is imported, an uncaught exception ends the process with status 1 right after
its traceback is printed (and reported to the launcher where it started the process), without
the exit handlers; and each initialization gives SIGTERM back the handling it had before (the
default: the process ends), unless `JAX_ENABLE_PREEMPTION_SERVICE` is set in the environment,
which keeps JAX's preemption handling for programs that act on it
(`multihost_utils.reached_preemption_sync_point`, Orbax's saving on preemption).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from fastpjit import _launched
from fastpjit._jax import cluster_env

# Set, it keeps JAX's preemption handling (JAX reads it as jax_enable_preemption_service).
KEEP_PREEMPTION = "JAX_ENABLE_PREEMPTION_SERVICE"
# The status of a process that an uncaught exception ended, as Python's own.
EXCEPTION_STATUS = 1


def install() -> None:
    """Installs the exception hook and the initialization hook; see the module."""
    report = _launched.report_channel()
    previous = sys.excepthook

    def print_then_end(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        previous(exc_type, exc, tb)
        if report is not None:
            report(exc_type.__name__)
        if cluster_env.processes() > 1:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            if issubclass(exc_type, KeyboardInterrupt):  # dies by SIGINT, as Python does
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGINT)
            os._exit(EXCEPTION_STATUS)

    sys.excepthook = print_then_end
    cluster_env.around_initialize(_initialize_keeping_sigterm)


def _initialize_keeping_sigterm(initialize: Callable[..., None], *args: Any, **kwargs: Any) -> None:
    before = signal.getsignal(signal.SIGTERM)
    initialize(*args, **kwargs)
    if KEEP_PREEMPTION in os.environ or not cluster_env.preemption_notified():
        return
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, before if before is not None else signal.SIG_DFL)
    else:  # only the main thread sets Python's handlers; the default is the C library's
        _default_sigterm()


def _default_sigterm() -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.restype = ctypes.c_void_p
    libc.signal(signal.SIGTERM, ctypes.c_void_p(0))  # SIG_DFL
