"""The launcher's own behaviour, with small Python scripts that start no JAX runtime: output,
failures, Ctrl-C, --timeout, the environment it gives each process, and JAX's detection of it.
Runs of JAX processes under the launcher are in test_multiprocess.py."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from jax._src import clusters

from fastpjit import _launched
from fastpjit._jax.cluster_env import JaxVariablesCluster, LaunchedCluster
from fastpjit.launch import STOP_GRACE_S, TIMEOUT_STATUS, Launcher

LAUNCH = [sys.executable, "-m", "fastpjit.launch"]


def script(tmp_path, text: str) -> str:
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(text))
    return str(path)


def run(path: str, nproc: int, *args: str, **options) -> tuple[int, str, str, Launcher]:
    out, err = io.BytesIO(), io.BytesIO()
    launcher = Launcher(path, args, nproc=nproc, stdout=out, stderr=err, **options)
    status = launcher.run()
    return status, out.getvalue().decode(), err.getvalue().decode(), launcher


def gone(pid: int) -> bool:
    """Whether `pid` has exited (a zombie that its new parent has not reaped counts)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.subprocess
def test_each_line_is_prefixed_with_its_process_index(tmp_path):
    path = script(
        tmp_path,
        """
        import os, sys
        index = os.environ["FASTPJIT_PROCESS_ID"]
        print(f"out {index} of {os.environ['FASTPJIT_NUM_PROCESSES']}")
        print("two\\nlines")
        sys.stderr.write(f"err {index} " + sys.argv[1])  # no newline at the end
    """,
    )
    status, out, err, launcher = run(path, 3, "arg")
    assert status == 0
    for i in range(3):
        mine = [line for line in out.splitlines() if line.startswith(f"[{i}] ")]
        assert mine == [f"[{i}] out {i} of 3", f"[{i}] two", f"[{i}] lines"]
        assert f"[{i}] err {i} arg\n" in err
    assert all(re.match(r"\[\d\] ", line) for line in out.splitlines())
    assert [c.returncode for c in launcher.children] == [0, 0, 0]
    assert launcher.alive() == []


@pytest.mark.subprocess
def test_ten_or_more_processes_align_their_prefixes(tmp_path):
    path = script(tmp_path, "print('hi')\n")
    status, out, _, _ = run(path, 11)
    assert status == 0
    assert "[ 0] hi\n" in out and "[10] hi\n" in out


@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("how", "status", "said"),
    [
        ("sys.exit(3)", 3, "exited with status 3"),
        ("os.kill(os.getpid(), signal.SIGKILL)", 128 + signal.SIGKILL, "was killed by SIGKILL"),
    ],
)
def test_a_failed_process_stops_the_others(tmp_path, how, status, said):
    path = script(
        tmp_path,
        f"""
        import os, signal, sys, time
        if os.environ["FASTPJIT_PROCESS_ID"] == "1":
            time.sleep(0.5)
            {how}
        time.sleep(600)
    """,
    )
    started = time.monotonic()
    got, _, err, launcher = run(path, 3)
    assert got == status, err
    assert time.monotonic() - started < STOP_GRACE_S + 5
    assert f"fastpjit.launch: process 1 {said}; stopping the other processes" in err
    # The sleepers ended by SIGTERM, at once.
    assert [launcher.children[i].returncode for i in (0, 2)] == [-signal.SIGTERM] * 2
    assert launcher.alive() == []


@pytest.mark.subprocess
def test_an_uncaught_exception_is_reported_before_the_process_exits(tmp_path):
    # A process that raises after jax.distributed.initialize() waits at exit, in JAX's
    # shutdown barrier, for its peers; an exit handler that never returns stands in for it.
    path = script(
        tmp_path,
        """
        import atexit, os, time
        import fastpjit
        atexit.register(time.sleep, 600)
        if os.environ["FASTPJIT_PROCESS_ID"] == "1":
            1 / 0
        time.sleep(600)
    """,
    )
    started = time.monotonic()
    status, _, err, launcher = run(path, 2)
    assert status == 1, err
    assert time.monotonic() - started < STOP_GRACE_S + 15
    assert "[1] ZeroDivisionError: division by zero\n" in err
    said = "fastpjit.launch: process 1 raised ZeroDivisionError; stopping the other processes"
    assert said in err
    assert err.index("[1] ZeroDivisionError") < err.index("process 1 raised")
    assert launcher.alive() == []


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_whole_process_group_is_stopped(tmp_path):
    # A process's own children are in its group, and go with it.
    path = script(
        tmp_path,
        """
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print("grandchild", child.pid, flush=True)
        time.sleep(600)
    """,
    )
    status, out, err, launcher = run(path, 2, timeout=2)
    assert status == TIMEOUT_STATUS, err
    assert "fastpjit.launch: --timeout of 2 s reached; stopping every process" in err
    grandchildren = [int(pid) for pid in re.findall(r"grandchild (\d+)", out)]
    assert len(grandchildren) == 2
    assert all(gone(pid) for pid in grandchildren)
    assert launcher.alive() == []


@pytest.mark.subprocess
def test_a_grandchild_left_behind_is_killed_at_the_end(tmp_path):
    path = script(
        tmp_path,
        """
        import subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print("grandchild", child.pid, flush=True)
    """,
    )
    status, out, _, launcher = run(path, 1)
    assert status == 0
    (grandchild,) = map(int, re.findall(r"grandchild (\d+)", out))
    assert gone(grandchild)
    assert launcher.alive() == []


@pytest.mark.slow
@pytest.mark.subprocess
def test_sigint_and_timeout_from_the_command_line(tmp_path):
    path = script(
        tmp_path,
        """
        import os, time
        print("pid", os.getpid(), flush=True)
        time.sleep(600)
    """,
    )
    with subprocess.Popen(
        [*LAUNCH, "--nproc", "2", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as launcher:
        pids = [int(launcher.stdout.readline().split()[-1]) for _ in range(2)]
        launcher.send_signal(signal.SIGINT)
        out, err = launcher.communicate(timeout=STOP_GRACE_S + 10)
    assert launcher.returncode == 128 + signal.SIGINT, err
    assert "fastpjit.launch: SIGINT received; stopping every process" in err
    assert "KeyboardInterrupt" in err  # Python's own Ctrl-C, in each process
    assert all(gone(pid) for pid in pids)

    started = time.monotonic()
    done = subprocess.run(
        [*LAUNCH, "--nproc", "2", "--timeout", "1.5", path],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == TIMEOUT_STATUS, done.stderr
    assert time.monotonic() - started < 1.5 + STOP_GRACE_S + 5
    assert "--timeout of 1.5 s reached" in done.stderr


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal: Linux")
def test_processes_die_with_a_launcher_that_is_killed_outright(tmp_path):
    # No launcher code runs on SIGKILL: each process asked the kernel, at `import fastpjit`.
    path = script(
        tmp_path,
        """
        import os, time
        import fastpjit
        print("pid", os.getpid(), flush=True)
        time.sleep(600)
    """,
    )
    with subprocess.Popen(
        [*LAUNCH, "--nproc", "2", path],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as launcher:
        pids = [int(launcher.stdout.readline().split()[-1]) for _ in range(2)]
        launcher.kill()
        launcher.wait()
    deadline = time.monotonic() + 10
    while not all(gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(gone(pid) for pid in pids)


@pytest.mark.subprocess
@pytest.mark.parametrize(
    "args",
    [
        ["--nproc", "0", "x.py"],
        ["--nproc", "2", "--timeout", "0", "x.py"],
        ["--nproc", "2", "no-such-script.py"],
    ],
)
def test_bad_command_lines_are_usage_errors(args):
    done = subprocess.run([*LAUNCH, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "usage: python -m fastpjit.launch" in done.stderr


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="nproc must be at least 1, got 0"):
        Launcher("x.py", nproc=0)
    with pytest.raises(ValueError, match="local_devices must be at least 1"):
        Launcher("x.py", nproc=1, local_devices=0)
    with pytest.raises(ValueError, match="timeout must be a positive"):
        Launcher("x.py", nproc=1, timeout=-1)


def test_the_environment_of_each_process(monkeypatch):
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.1:1234")  # the caller's, replaced
    monkeypatch.setenv("https_proxy", "http://proxy:3128")
    monkeypatch.delenv("no_proxy", raising=False)
    launcher = Launcher("x.py", nproc=2, local_devices=4)
    env = launcher.child_environment(1, "127.0.0.1:5000", 7)
    assert env[_launched.PROCESS_ID] == "1"
    assert env[_launched.NUM_PROCESSES] == "2"
    assert env[_launched.COORDINATOR_ADDRESS] == "127.0.0.1:5000"
    assert env[_launched.LAUNCHER_PID] == str(os.getpid())
    assert env[_launched.REPORT_FD] == "7"
    # The coordinator listens on loopback only.
    assert env["JAX_COORDINATOR_ADDRESS"] == env["JAX_COORDINATOR_BIND_ADDRESS"] == "127.0.0.1:5000"
    assert env["JAX_NUM_CPU_DEVICES"] == "4"
    assert env["JAX_LOCAL_DEVICE_IDS"] == "4,5,6,7"
    assert env["no_proxy"].split(",")[-1] == "127.0.0.1"
    # Without --local-devices, the caller's device settings stand.
    plain = Launcher("x.py", nproc=2).child_environment(0, "127.0.0.1:5000", 7)
    for name in ("JAX_NUM_CPU_DEVICES", "JAX_LOCAL_DEVICE_IDS", "XLA_FLAGS"):
        assert plain.get(name) == os.environ.get(name)


def test_jax_finds_the_launch_before_any_other_cluster(monkeypatch):
    # Inside a SLURM allocation, say, the launcher's processes are still its own.
    slurm = {
        "SLURM_JOB_ID": "1",
        "SLURM_STEP_NODELIST": "node[0-3]",
        "SLURM_NTASKS": "16",
        "SLURM_PROCID": "9",
        "SLURM_LOCALID": "3",
    }
    for name, value in slurm.items():
        monkeypatch.setenv(name, value)
    assert clusters.SlurmCluster.is_env_present()
    monkeypatch.setenv(_launched.PROCESS_ID, "1")
    monkeypatch.setenv(_launched.NUM_PROCESSES, "2")
    monkeypatch.setenv(_launched.COORDINATOR_ADDRESS, "127.0.0.1:5000")
    assert clusters.ClusterEnv._cluster_types[0] is LaunchedCluster
    detected = clusters.ClusterEnv.auto_detect_unset_distributed_params(
        None, None, None, None, None, 300
    )
    assert detected == ("127.0.0.1:5000", 2, 1, [1])
    monkeypatch.delenv(_launched.PROCESS_ID)
    assert not LaunchedCluster.is_env_present()


def test_jax_s_own_detectors_come_before_jax_variables(monkeypatch):
    # JAX_NUM_PROCESSES and JAX_PROCESS_ID (Kubeflow, Ray) are read only where JAX detects no
    # cluster: inside a SLURM job, SLURM's variables win.
    for name, value in {
        "JAX_COORDINATOR_ADDRESS": "10.0.0.5:1234",
        "JAX_NUM_PROCESSES": "4",
        "JAX_PROCESS_ID": "3",
    }.items():
        monkeypatch.setenv(name, value)
    assert clusters.ClusterEnv._cluster_types[-1] is JaxVariablesCluster
    detected = clusters.ClusterEnv.auto_detect_unset_distributed_params(
        None, None, None, None, None, 300
    )
    assert detected == ("10.0.0.5:1234", 4, 3, None)
    monkeypatch.delenv("JAX_PROCESS_ID")
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "2")  # a Kubernetes Indexed Job's pod
    assert JaxVariablesCluster.get_process_id() == 2
    monkeypatch.setenv("JAX_NUM_PROCESSES", "four")
    with pytest.raises(ValueError, match="JAX_NUM_PROCESSES must be an integer, got 'four'"):
        JaxVariablesCluster.get_process_count()
    monkeypatch.setenv("JAX_NUM_PROCESSES", "4")
    for name, value in {"SLURM_JOB_ID": "1", "SLURM_NTASKS": "2", "SLURM_PROCID": "1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SLURM_STEP_NODELIST", "node0")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    detected = clusters.ClusterEnv.auto_detect_unset_distributed_params(
        None, None, None, None, None, 300
    )
    assert detected[1:3] == (2, 1)


@pytest.mark.subprocess
def test_the_launcher_says_which_job_it_runs_inside_another(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_NTASKS", "3")
    path = script(tmp_path, "import os; print(os.environ['FASTPJIT_NUM_PROCESSES'])")
    status, out, err, _ = run(path, 2)
    assert status == 0, err
    assert sorted(out.splitlines()) == ["[0] 2", "[1] 2"]  # in the order they were printed
    assert err.startswith(
        "fastpjit.launch: inside SLURM job 42 of 3 tasks: this run is a job of its own, of 2 "
        "processes on this machine (--nproc)"
    ), err
