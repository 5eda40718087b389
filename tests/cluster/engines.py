"""The engines that clusters start jobs with, for real on this machine: a one-machine SLURM
cluster on loopback (munged, slurmctld and slurmd, in a directory of their own) and Open MPI's
`mpirun`, installed from Debian's packages where they are missing.

Each runs a script as 2 processes with 4 CPU devices each, which join through a plain
`jax.distributed.initialize()`: JAX's own detection of SLURM and Open MPI finds them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

PACKAGES = ("slurm-wlm", "munge", "openmpi-bin")
COMMANDS = ("srun", "sbatch", "sinfo", "scancel", "slurmctld", "slurmd", "munged", "mpirun")
NPROC = 2
LOCAL_DEVICES = 4
# What every process of a job needs beyond the caller's environment.
JOB_ENV = {"JAX_NUM_CPU_DEVICES": str(LOCAL_DEVICES), "JAX_PLATFORMS": "cpu"}


class EngineUnavailable(RuntimeError):
    """An engine could not be installed or started here: the cluster tests fail with it."""


def ensure_installed() -> None:
    """Installs SLURM, munge and Open MPI from Debian's packages where a command is missing;
    raises `EngineUnavailable`, saying why, where they cannot be."""
    if not _missing():
        return
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        raise EngineUnavailable(
            f"missing {', '.join(_missing())}, and only root with apt-get can install "
            f"{' '.join(PACKAGES)} here"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES]
    done = subprocess.run(install, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:  # a stale package index: refreshed once
        subprocess.run(["apt-get", "update"], env=env, capture_output=True, timeout=600)
        done = subprocess.run(install, env=env, capture_output=True, text=True, timeout=900)
    if _missing():
        raise EngineUnavailable(
            f"apt-get could not install {' '.join(PACKAGES)} (still missing "
            f"{', '.join(_missing())}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )


def _missing() -> list[str]:
    return [command for command in COMMANDS if shutil.which(command) is None]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Slurm:
    """A SLURM cluster of this machine alone, on loopback, with no cgroups
    (`proctrack/linuxproc`, `task/none`), run as root: `start()` starts munged, slurmctld and
    slurmd in `directory` and waits until the node is idle; `stop()` stops each by its process
    id. Jobs are started with `srun(...)`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.conf = directory / "slurm.conf"
        self.daemons: list[subprocess.Popen[bytes]] = []
        self._logs: list[BinaryIO] = []

    def start(self) -> None:
        if os.geteuid() != 0:
            raise EngineUnavailable("the one-machine SLURM cluster runs as root (SlurmdUser)")
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        for sub in ("munge", "state", "spool", "log"):
            (self.directory / sub).mkdir(mode=0o700, exist_ok=True)
        key = self.directory / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        socket_path = self.directory / "munge" / "socket"
        self._daemon(
            "munged",
            "--foreground",
            "--force",
            f"--key-file={key}",
            f"--socket={socket_path}",
            f"--pid-file={self.directory / 'munge' / 'pid'}",
            f"--seed-file={self.directory / 'munge' / 'seed'}",
            f"--log-file={self.directory / 'log' / 'munged.log'}",
        )
        self._wait(socket_path.exists, "munged's socket")
        self.conf.write_text(self._config(socket_path))
        self._daemon("slurmctld", "-D", "-f", str(self.conf))
        self._daemon("slurmd", "-D", "-f", str(self.conf))
        self._wait(self._idle, "the node to be idle")

    def _config(self, munge_socket: Path) -> str:
        d, host = self.directory, socket.gethostname()
        return "\n".join(
            [
                "ClusterName=fastpjit",
                f"SlurmctldHost={host}(127.0.0.1)",
                "SlurmUser=root",
                "SlurmdUser=root",
                f"SlurmctldPort={_free_port()}",
                f"SlurmdPort={_free_port()}",
                "AuthType=auth/munge",
                "CredType=cred/munge",
                f"AuthInfo=socket={munge_socket}",
                f"StateSaveLocation={d / 'state'}",
                f"SlurmdSpoolDir={d / 'spool'}",
                f"SlurmctldPidFile={d / 'slurmctld.pid'}",
                f"SlurmdPidFile={d / 'slurmd.pid'}",
                f"SlurmctldLogFile={d / 'log' / 'slurmctld.log'}",
                f"SlurmdLogFile={d / 'log' / 'slurmd.log'}",
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "JobAcctGatherType=jobacct_gather/none",
                "AccountingStorageType=accounting_storage/none",
                "JobCompType=jobcomp/none",
                "SchedulerType=sched/builtin",
                "SelectType=select/linear",
                "MpiDefault=none",
                "ReturnToService=2",
                "PlugStackConfig=/dev/null",
                f"NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} State=UNKNOWN",
                f"PartitionName=local Nodes={host} Default=YES MaxTime=INFINITE State=UP "
                "OverSubscribe=YES",
                "",
            ]
        )

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def srun(self, argv: Sequence[str]) -> list[str]:
        """The command that runs `argv` as the job's processes, each line labelled with its
        process's rank (`0: ...`), the job ended when one of them fails."""
        exports = ",".join(f"{k}={v}" for k, v in JOB_ENV.items())
        return [
            "srun",
            f"--ntasks={NPROC}",
            "--kill-on-bad-exit=1",
            "--label",
            f"--export=ALL,{exports}",
            *argv,
        ]

    def sbatch(self, script: Path) -> subprocess.CompletedProcess[str]:
        """Submits a batch script and waits for its job to end."""
        return subprocess.run(
            ["sbatch", "--wait", str(script)],
            env=self.env(),
            cwd=script.parent,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    def _daemon(self, *argv: str) -> None:
        log = (self.directory / "log" / f"{argv[0]}.out").open("wb")
        self._logs.append(log)
        self.daemons.append(
            subprocess.Popen(
                argv, env=self.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        )

    def _idle(self) -> bool:
        done = subprocess.run(
            ["sinfo", "--noheader", "--format=%T"],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        return done.returncode == 0 and done.stdout.strip() == "idle"

    def _wait(self, ready: Callable[[], bool], what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for daemon in self.daemons:
                if daemon.poll() is not None:
                    raise EngineUnavailable(f"{daemon.args[0]} exited: {self.logs()}")
            if ready():
                return
            time.sleep(0.2)
        raise EngineUnavailable(f"timed out waiting for {what}: {self.logs()}")

    def logs(self) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}"
            for path in sorted((self.directory / "log").glob("*"))
        )

    def stop(self) -> None:
        """Cancels what runs, then stops slurmd, slurmctld and munged by their process ids
        (SIGTERM, then SIGKILL after 10 s), with whatever they started."""
        user = ["--user", str(os.geteuid())]
        subprocess.run(["scancel", "--full", "--quiet", *user], env=self.env(), timeout=30)
        for daemon in reversed(self.daemons):
            if daemon.poll() is None:
                daemon.send_signal(signal.SIGTERM)
                try:
                    daemon.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    daemon.kill()
                    daemon.wait(timeout=10)
            # Anything left in its session (a job step that outlived its daemon).
            with contextlib.suppress(ProcessLookupError):
                os.killpg(daemon.pid, signal.SIGKILL)
        self.daemons.clear()
        for log in self._logs:
            log.close()
        self._logs.clear()


def mpirun(argv: Sequence[str]) -> list[str]:
    """The command that runs `argv` as an Open MPI job on this machine, on loopback, each line
    tagged with its process's rank (`[1,0]<stdout>:...`)."""
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    exports = [arg for k, v in JOB_ENV.items() for arg in ("-x", f"{k}={v}")]
    return [
        "mpirun",
        *root,
        "--oversubscribe",
        "--tag-output",
        "--mca",
        "oob_tcp_if_include",
        "lo",
        "--mca",
        "btl_tcp_if_include",
        "lo",
        "-np",
        str(NPROC),
        *exports,
        *argv,
    ]


def python(script: Path, *args: str) -> list[str]:
    """This interpreter running `script`, unbuffered."""
    return [sys.executable, "-u", str(script), *args]
