"""The contract between `python -m fastpjit.launch` and the processes it starts: the environment
variables that tell a process where it stands, and what such a process does at `import fastpjit`.

Standard library only: the launcher and `fastpjit._jax.cluster_env` (whose cluster environment
reads these variables for `jax.distributed.initialize()`) both import it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from typing import Any

# Set by the launcher in each process it starts.
PROCESS_ID = "FASTPJIT_PROCESS_ID"
NUM_PROCESSES = "FASTPJIT_NUM_PROCESSES"
COORDINATOR_ADDRESS = "FASTPJIT_COORDINATOR_ADDRESS"
LAUNCHER_PID = "FASTPJIT_LAUNCHER_PID"
# A pipe to the launcher, on which a process reports an uncaught exception as it happens.
REPORT_FD = "FASTPJIT_LAUNCH_REPORT_FD"

_PR_SET_PDEATHSIG = 1


def launched() -> bool:
    """Whether this process was started by the launcher (or inherited its environment)."""
    return PROCESS_ID in os.environ


def install() -> None:
    """Ties a process that the launcher started to the launcher.

    Only the launcher's own children, not processes that they start in turn and that inherit
    the environment: those would report their exceptions as the launched process's.
    """
    if not launched() or str(os.getppid()) != os.environ.get(LAUNCHER_PID):
        return
    _die_with_launcher()
    _report_uncaught_exceptions(int(os.environ[PROCESS_ID]), os.environ.get(REPORT_FD))


def _die_with_launcher() -> None:
    # A launcher killed outright (SIGKILL, the OOM killer) cannot stop its children; the kernel
    # then does. Set here rather than between fork and exec, where the launcher (which has
    # native threads once numpy is imported) could only run Python unsafely.
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return


def _report_uncaught_exceptions(index: int, report_fd: str | None) -> None:
    # After jax.distributed.initialize(), a process that raises does not exit: JAX's exit
    # handler waits in the coordination service's shutdown barrier for peers that may be
    # waiting on it in a collective. So the process says that it failed as soon as the
    # traceback is printed, and the launcher stops every process.
    if report_fd is None:
        return
    fd = int(report_fd)
    previous = sys.excepthook

    def print_then_report(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        previous(exc_type, exc, tb)
        with contextlib.suppress(OSError):
            os.write(fd, f"{index} {exc_type.__name__}\n".encode())

    sys.excepthook = print_then_report
