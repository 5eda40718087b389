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
from collections.abc import Callable

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


def _child() -> bool:
    """Whether this process is one that the launcher started itself: not a process that one
    of them started in turn and that inherits the environment (whose exceptions are not the
    launched process's)."""
    return launched() and str(os.getppid()) == os.environ.get(LAUNCHER_PID)


def install() -> None:
    """Ties a process that the launcher started to the launcher: killed outright, the launcher
    takes it with it."""
    if _child():
        _die_with_launcher()


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


def report_channel() -> Callable[[str], None] | None:
    """In a process that the launcher started: a function that tells the launcher at once that
    the process raised an exception of the type named, which the launcher then stops every
    process for; else None."""
    report_fd = os.environ.get(REPORT_FD)
    if not _child() or report_fd is None:
        return None
    index, fd = int(os.environ[PROCESS_ID]), int(report_fd)

    def report(exc_type: str) -> None:
        with contextlib.suppress(OSError):
            os.write(fd, f"{index} {exc_type}\n".encode())

    return report
