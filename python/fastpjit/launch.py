"""`python -m fastpjit.launch`: one script run as N processes of a multi-process JAX program on
this machine, started, watched and stopped together.

    python -m fastpjit.launch --nproc 2 --local-devices 4 [--timeout 600] train.py [args...]

The processes join through `jax.distributed`: process 0 runs the coordinator on 127.0.0.1 at a
free port, bound to loopback only. The script needs no launcher-specific code: once it has
imported fastpjit, a plain `jax.distributed.initialize()` finds the coordinator, the process
count and its own process id in the environment that the launcher sets (`fastpjit._launched`).

Each line that a process prints comes out prefixed with its process index, on the launcher's
stdout or stderr as the process wrote it. When a process exits with a non-zero status, is
killed, or raises, the launcher stops all the others and exits non-zero, naming it; Ctrl-C and
`--timeout` stop every process too.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import BinaryIO, TypeVar

from fastpjit import _launched

Number = TypeVar("Number", int, float)

__all__ = ["STOP_GRACE_S", "TIMEOUT_STATUS", "Child", "Launcher", "main"]

# How long stopped processes get to exit before they are killed. JAX processes rarely use it:
# JAX's preemption notifier catches SIGTERM (a program may act on it at its next sync point),
# and SIGINT does not interrupt a collective; but a script may still flush and exit.
STOP_GRACE_S = 3.0
# Exit status on --timeout, as timeout(1) gives.
TIMEOUT_STATUS = 124
# How often the launcher looks for exited processes between lines of output.
_POLL_S = 0.05
# Once every process has exited, how long output still in the pipes is awaited: a process may
# have left children of its own that hold a pipe open.
_DRAIN_S = 1.0
# A line longer than this is relayed in pieces rather than held back.
_MAX_LINE = 1 << 16


@dataclass
class Child:
    """A process that the launcher started. It leads a process group of its own (id: its pid),
    which everything it starts joins unless moved, so that stopping the group stops them all."""

    index: int
    popen: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        """Its exit status once it has exited (-N: killed by signal N), else None."""
        return self.popen.returncode


class _LineRelay:
    """Relays the bytes of one process's stdout or stderr line by line, each line prefixed."""

    def __init__(self, prefix: bytes, target: BinaryIO) -> None:
        self._prefix = prefix
        self._target = target
        self._partial = b""

    def feed(self, data: bytes) -> None:
        *lines, self._partial = (self._partial + data).split(b"\n")
        if len(self._partial) > _MAX_LINE:
            lines.append(self._partial)
            self._partial = b""
        if lines:
            _write(self._target, b"".join(self._prefix + line + b"\n" for line in lines))

    def close(self) -> None:
        if self._partial:
            _write(self._target, self._prefix + self._partial + b"\n")
            self._partial = b""


def _write(target: BinaryIO, data: bytes) -> None:
    # A reader that went away (`| head`) stops the output, not the run.
    try:
        target.write(data)
        target.flush()
    except (BrokenPipeError, ValueError):
        pass


class Launcher:
    """Runs `script` as `nproc` processes joined through jax.distributed; see the module.

    `run()` starts them and returns once every one has exited; `children` then holds each
    process with its exit status, and `alive()` lists any whose process group still has a
    process in it (none, unless a process left its group). `request_stop(signum)` stops the
    run as Ctrl-C does; a second request kills at once.
    """

    def __init__(
        self,
        script: str,
        args: Sequence[str] = (),
        *,
        nproc: int,
        local_devices: int | None = None,
        timeout: float | None = None,
        stdout: BinaryIO | None = None,
        stderr: BinaryIO | None = None,
    ) -> None:
        if nproc < 1:
            raise ValueError(f"nproc must be at least 1, got {nproc}")
        if local_devices is not None and local_devices < 1:
            raise ValueError(f"local_devices must be at least 1 or None, got {local_devices}")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout}")
        self.script = script
        self.args = list(args)
        self.nproc = nproc
        self.local_devices = local_devices
        self.timeout = timeout
        self.children: list[Child] = []
        self._stdout = stdout if stdout is not None else sys.stdout.buffer
        self._stderr = stderr if stderr is not None else sys.stderr.buffer
        self._relays: dict[int, _LineRelay] = {}
        self._exited: set[int] = set()
        self._report = b""
        self._requested: int | None = None
        self._force = False
        self._status: int | None = None
        self._stopping_since: float | None = None
        self._killed = False

    # --- What the caller sees -------------------------------------------------------------

    def run(self) -> int:
        """Starts the processes, relays their output until all have exited, and returns the
        launcher's exit status: 0 when every process exited with 0; else the failed process's
        status (128 + N when killed by signal N, 1 when it raised), 124 on timeout, or 128 + N
        when stopped by signal N."""
        if self.children:
            raise RuntimeError("a Launcher runs once")
        around = engine_around(os.environ)
        if around is not None:
            self._say(
                f"inside {around}: this run is a job of its own, of {self.nproc} processes on "
                "this machine (--nproc), joined through its own coordinator; to run in the "
                "job's processes, start the script with the job's engine instead (srun, "
                "mpirun), without the launcher"
            )
        started = time.monotonic()
        deadline = None if self.timeout is None else started + self.timeout
        address = f"127.0.0.1:{_free_loopback_port()}"
        with selectors.DefaultSelector() as selector:
            try:
                self._start_all(address, selector)
                self._supervise(selector, deadline)
                self._drain(selector)
            finally:
                self._kill_leftovers(selector)
        if self._status is None:
            self._status = 0
        if self._status != 0:
            self._say(
                "how each process ended: "
                + "; ".join(f"process {c.index} {_describe(c.returncode)}" for c in self.children)
            )
        return self._status

    def request_stop(self, signum: int = signal.SIGINT) -> None:
        """Stops every process: sends them `signum`, and kills any left after a grace period.
        Safe to call from a signal handler."""
        if self._requested is not None:
            self._force = True
        else:
            self._requested = signum

    def alive(self) -> list[Child]:
        """The children whose process group still has a running process (zombies aside)."""
        return [child for child in self.children if _group_running(child.pid)]

    # --- Start-up --------------------------------------------------------------------------

    def child_environment(self, index: int, address: str, report_fd: int) -> dict[str, str]:
        """The environment of process `index`: the caller's, plus where it stands."""
        env = dict(os.environ)
        env.update(
            {
                _launched.PROCESS_ID: str(index),
                _launched.NUM_PROCESSES: str(self.nproc),
                _launched.COORDINATOR_ADDRESS: address,
                _launched.LAUNCHER_PID: str(os.getpid()),
                _launched.REPORT_FD: str(report_fd),
                # jax.distributed.initialize() reads these two before any cluster environment: the
                # first would otherwise win over ours if the caller had it set, and without the
                # second the coordinator would listen on every interface ([::]).
                "JAX_COORDINATOR_ADDRESS": address,
                "JAX_COORDINATOR_BIND_ADDRESS": address,
                # Lines reach the launcher as they are printed, not when a buffer fills.
                "PYTHONUNBUFFERED": "1",
            }
        )
        if self.local_devices is not None:
            k = self.local_devices
            env["JAX_NUM_CPU_DEVICES"] = str(k)
            # On GPUs, which devices each process sees (JAX ignores it on the CPU).
            env["JAX_LOCAL_DEVICE_IDS"] = ",".join(str(index * k + d) for d in range(k))
        _bypass_proxies(env)
        return env

    def _start_all(self, address: str, selector: selectors.BaseSelector) -> None:
        report_read, report_write = os.pipe()
        os.set_blocking(report_read, False)
        selector.register(report_read, selectors.EVENT_READ, None)
        width = len(str(self.nproc - 1))
        try:
            for index in range(self.nproc):
                popen = subprocess.Popen(
                    [sys.executable, self.script, *self.args],
                    env=self.child_environment(index, address, report_write),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    pass_fds=(report_write,),
                    process_group=0,
                )
                self.children.append(Child(index, popen))
                prefix = f"[{index:>{width}}] ".encode()
                for pipe, target in ((popen.stdout, self._stdout), (popen.stderr, self._stderr)):
                    assert pipe is not None
                    fd = pipe.fileno()
                    os.set_blocking(fd, False)
                    self._relays[fd] = _LineRelay(prefix, target)
                    selector.register(fd, selectors.EVENT_READ, pipe)
        finally:
            # Only the children write reports; the pipe ends when the last of them exits.
            os.close(report_write)

    # --- Supervision -----------------------------------------------------------------------

    def _supervise(self, selector: selectors.BaseSelector, deadline: float | None) -> None:
        while True:
            self._relay(selector, _POLL_S)
            self._notice_exits()
            if len(self._exited) == len(self.children):
                return
            now = time.monotonic()
            if self._stopping_since is None:
                if self._requested is not None:
                    name = signal.Signals(self._requested).name
                    self._stop(
                        self._requested,
                        128 + self._requested,
                        f"{name} received; stopping every process",
                    )
                elif deadline is not None and now >= deadline:
                    self._stop(
                        signal.SIGTERM,
                        TIMEOUT_STATUS,
                        f"--timeout of {self.timeout:g} s reached; stopping every process",
                    )
            elif not self._killed and (self._force or now - self._stopping_since >= STOP_GRACE_S):
                self._signal_all(signal.SIGKILL)
                self._killed = True

    def _relay(self, selector: selectors.BaseSelector, timeout: float) -> None:
        """Relays what the pipes hold, waiting up to `timeout` for something to arrive."""
        reports = []
        for key, _ in selector.select(timeout):
            try:
                data = os.read(key.fd, _MAX_LINE)
            except BlockingIOError:
                continue
            if not data:
                self._close(selector, key)
            elif key.data is None:
                reports.append(data)
            else:
                self._relays[key.fd].feed(data)
        # Reports after output: the traceback that a report follows is relayed first.
        for data in reports:
            self._read_reports(data)

    def _read_reports(self, data: bytes) -> None:
        *lines, self._report = (self._report + data).split(b"\n")
        for line in lines:
            index, _, exc_type = line.decode(errors="replace").partition(" ")
            if index.isdigit():
                self._fail(int(index), f"raised {exc_type}", 1)

    def _notice_exits(self) -> None:
        for child in self.children:
            if child.index not in self._exited and child.popen.poll() is not None:
                self._exited.add(child.index)
                code = child.popen.returncode
                if code != 0:
                    self._fail(child.index, _describe(code), code if code > 0 else 128 - code)

    def _fail(self, index: int, what: str, status: int) -> None:
        if self._stopping_since is None:
            others = "; stopping the other processes" if self.nproc > 1 else ""
            self._stop(signal.SIGTERM, status, f"process {index} {what}{others}")

    def _stop(self, signum: int, status: int, message: str) -> None:
        self._status = status
        self._say(message)
        self._stopping_since = time.monotonic()
        self._signal_all(signum)

    def _signal_all(self, signum: int) -> None:
        for child in self.children:
            if child.popen.poll() is None:
                _signal_group(child.pid, signum)

    # --- The end ---------------------------------------------------------------------------

    def _drain(self, selector: selectors.BaseSelector) -> None:
        end = time.monotonic() + _DRAIN_S
        while self._relays and time.monotonic() < end:
            self._relay(selector, min(_POLL_S, max(0.0, end - time.monotonic())))

    def _kill_leftovers(self, selector: selectors.BaseSelector) -> None:
        """Kills every process group that the launcher started, whatever is left in it, and
        closes the pipes."""
        for child in self.children:
            _signal_group(child.pid, signal.SIGKILL)
            child.popen.wait()
        # A killed process is gone a moment after the signal, not as it is sent.
        end = time.monotonic() + _DRAIN_S
        while self.alive() and time.monotonic() < end:
            time.sleep(0.01)
        for key in list(selector.get_map().values()):
            self._close(selector, key)

    def _close(self, selector: selectors.BaseSelector, key: selectors.SelectorKey) -> None:
        """Stops reading a pipe: a process's output (its last partial line relayed) or the
        report pipe."""
        selector.unregister(key.fd)
        if key.data is None:
            os.close(key.fd)
        else:
            self._relays.pop(key.fd).close()
            key.data.close()

    def _say(self, message: str) -> None:
        _write(self._stderr, f"fastpjit.launch: {message}\n".encode())


def engine_around(env: Mapping[str, str]) -> str | None:
    """The job of another engine that `env` is in (SLURM, Open MPI, a JAX_NUM_PROCESSES job),
    with its process count, if any."""
    if "SLURM_JOB_ID" in env:
        tasks = env.get("SLURM_NTASKS") or env.get("SLURM_NPROCS")
        return f"SLURM job {env['SLURM_JOB_ID']}" + (f" of {tasks} tasks" if tasks else "")
    if "OMPI_COMM_WORLD_SIZE" in env:
        return f"an Open MPI job of {env['OMPI_COMM_WORLD_SIZE']} processes"
    if "JAX_NUM_PROCESSES" in env:
        return f"a job of {env['JAX_NUM_PROCESSES']} processes (JAX_NUM_PROCESSES)"
    return None


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _group_running(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member exists, though not ours to signal
        return True
    if not os.path.isdir("/proc"):
        return True
    # The group has members; it runs unless all are zombies that their new parent has not
    # reaped yet (in a container, process 1 may never reap them).
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                state, _, group = f.read().rpartition(")")[2].split()[:3]
        except (OSError, ValueError):
            continue
        if int(group) == pgid and state != "Z":
            return True
    return False


def _describe(returncode: int | None) -> str:
    if returncode is None:
        return "is still running"
    if returncode < 0:
        return f"was killed by {signal.Signals(-returncode).name}"
    return f"exited with status {returncode}"


def _free_loopback_port() -> int:
    # The port is free now; process 0 binds it a second or so later. Another program could
    # take it in between, and process 0 would then fail to start (and the run with it).
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _bypass_proxies(env: dict[str, str]) -> None:
    # gRPC, which the coordination service runs on, sends connections through an HTTP proxy
    # that the environment names, loopback ones included, unless no_proxy excludes them.
    if not any(key.lower().endswith("_proxy") and key.lower() != "no_proxy" for key in env):
        return
    for key in ("no_proxy", "NO_PROXY"):
        hosts = [h for h in env.get(key, "").split(",") if h]
        env[key] = ",".join([*hosts, "127.0.0.1"])


def _positive(kind: type[Number]) -> Callable[[str], Number]:
    def parse(text: str) -> Number:
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


# The launcher's options for jax.distributed's mutual TLS, which each process gets as JAX's
# variables (--mtls-cert-file PATH: JAX_MTLS_CERT_FILE=PATH).
MTLS_OPTIONS = {
    "mtls-cert-file": "each process's certificate (PEM)",
    "mtls-key-file": "its private key (PEM)",
    "mtls-ca-file": "the certificate authority that signed the processes' certificates (PEM)",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m fastpjit.launch",
        description="Runs SCRIPT as N processes of one multi-process JAX program on this "
        "machine. The script calls jax.distributed.initialize() with no arguments, after "
        "`import fastpjit`.",
    )
    parser.add_argument(
        "--nproc", type=_positive(int), required=True, metavar="N", help="the number of processes"
    )
    parser.add_argument(
        "--local-devices",
        type=_positive(int),
        metavar="K",
        help="devices per process: K CPU devices; on GPUs, process i sees "
        "GPUs iK to iK+K-1 (by default: the CPU devices that the environment "
        "sets, and one GPU per process)",
    )
    parser.add_argument(
        "--timeout",
        type=_positive(float),
        metavar="S",
        help="stop every process after S seconds (exit status 124)",
    )
    for name, what in MTLS_OPTIONS.items():
        parser.add_argument(
            f"--{name}",
            metavar="PATH",
            help=f"mutual TLS with the coordinator: {what} (JAX 0.11.2 and newer)",
        )
    parser.add_argument("script", help="the Python script that every process runs")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    options = parser.parse_args(argv)
    if not os.path.isfile(options.script):
        parser.error(f"no such script: {options.script}")
    mtls = {name: getattr(options, name.replace("-", "_")) for name in MTLS_OPTIONS}
    mtls = {name: path for name, path in mtls.items() if path is not None}
    if mtls:
        from fastpjit._jax import line  # imports JAX, which the launcher needs only here

        if not line.COORDINATOR_MTLS:
            parser.error(
                f"--{next(iter(mtls))}: this JAX has no mutual TLS for jax.distributed's "
                "coordinator (it came with jax 0.11.2)"
            )
        for name, path in mtls.items():
            if not os.path.isfile(path):
                parser.error(f"--{name}: no such file: {path}")
            os.environ[f"JAX_{name.replace('-', '_').upper()}"] = os.path.abspath(path)
    launcher = Launcher(
        options.script,
        options.args,
        nproc=options.nproc,
        local_devices=options.local_devices,
        timeout=options.timeout,
    )
    stops = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, lambda signum, _: launcher.request_stop(signum)) for s in stops}
    try:
        return launcher.run()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


if __name__ == "__main__":
    sys.exit(main())
