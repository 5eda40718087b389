"""Multi-controller JAX: two processes with 4 CPU devices each, on loopback, started by
`python -m fastpjit.launch`.

One launch of `multiprocess_checks.py` runs every check of fastpjit against JAX across the two
processes; each test below reads its check's verdict in both. The others launch
`multiprocess_failures.py`, whose processes fail on purpose while a collective waits on them.
Each launch costs seconds of start-up (two JAX processes on two cores), so there are few.
"""

from __future__ import annotations

import io
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from lines import ON_0_10

from fastpjit.launch import STOP_GRACE_S, Launcher

# Every test launches JAX processes that join as one program: seconds each.
pytestmark = [pytest.mark.slow, pytest.mark.subprocess, pytest.mark.multiprocess]

HERE = Path(__file__).parent
LAUNCH = [sys.executable, "-m", "fastpjit.launch", "--nproc", "2", "--local-devices", "4"]
RUN_TIMEOUT_S = 150


# --- Every check against JAX, in one launch ------------------------------------------------


class ChecksRun:
    def __init__(self, returncode: int, output: str) -> None:
        self.returncode = returncode
        self.output = output
        self.verdicts: dict[str, dict[int, str]] = {}
        for process, name, verdict in re.findall(r"^\[(\d)\] CHECK (\w+) (\w+)$", output, re.M):
            self.verdicts.setdefault(name, {})[int(process)] = verdict

    def assert_passed(self, name: str) -> None:
        report = f"launcher exit {self.returncode}; output:\n{self.output[-12000:]}"
        assert self.verdicts.get(name) == {0: "ok", 1: "ok"}, report


@pytest.fixture(scope="module")
def checks() -> ChecksRun:
    command = [*LAUNCH, "--timeout", str(RUN_TIMEOUT_S), str(HERE / "multiprocess_checks.py")]
    for _ in range(2):
        done = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S + 30)
        run = ChecksRun(done.returncode, done.stdout + done.stderr)
        # A start-up failure (the coordinator's port taken between choosing and binding it) is
        # retried once; a run that got as far as the checks never is.
        if run.verdicts:
            break
    return run


# Every check of multiprocess_checks.py, in its order (the cluster tests run them too).
CHECKS = [
    "index_maps",
    "jit_over_a_global_mesh",
    "device_put_across_processes",
    "pmap_of_host_local_rows",
    "pmap_collectives_across_processes",
    "pmap_axes_statics_and_scalars_across_processes",
    "pmap_donation_across_processes",
    "make_array_1d_mesh",
    "make_array_2d_mesh",
    "make_array_dtypes_and_layouts",
    "make_array_bad_input",
    "make_array_counts_what_jax_does",
    "bound_function_across_processes",
    "warm_up_across_processes",
    "stats_across_processes",
    "results_as_one_process_computes_them",
]


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
@pytest.mark.parametrize("name", CHECKS)
def test_two_processes_agree_with_jax(checks, name):
    checks.assert_passed(name)


def one_process_results() -> dict[str, str]:
    """The digests of `multiprocess_checks.global_results()` computed by this process alone,
    on its 8 devices."""
    from multiprocess_checks import digest, global_results

    return {name.replace(" ", "_"): digest(value) for name, value in global_results().items()}


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_two_processes_compute_what_one_process_does(checks):
    expected = one_process_results()
    for process in (0, 1):
        found = re.findall(rf"^\[{process}\] RESULT (\S+) (\S+)$", checks.output, re.M)
        assert dict(found) == expected, checks.output[-6000:]


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_the_checks_run_exits_cleanly_with_prefixed_output(checks):
    assert checks.returncode == 0, checks.output[-12000:]
    assert "[0] CHECK index_maps ok" in checks.output
    assert "[1] CHECK index_maps ok" in checks.output


# --- Runs that fail: the launcher stops every process ---------------------------------------


def failures_script(mode: str) -> list[str]:
    return [str(HERE / "multiprocess_failures.py"), mode]


def gone(pgid: int) -> bool:
    """Whether process group `pgid` is empty (the launcher has reaped its one process)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.timeout(120)
def test_a_killed_peer_stops_the_run_within_seconds():
    out, err = io.BytesIO(), io.BytesIO()
    script, *args = failures_script("killed")
    launcher = Launcher(script, args, nproc=2, local_devices=4, timeout=100, stdout=out, stderr=err)
    started = time.monotonic()
    status = launcher.run()
    elapsed = time.monotonic() - started
    output = out.getvalue().decode() + err.getvalue().decode()
    assert status == 128 + signal.SIGKILL, output
    assert elapsed < 60, (elapsed, output)
    assert "[0] entering the collective" in output
    assert "the collective finished" not in output
    said = "fastpjit.launch: process 1 was killed by SIGKILL; stopping the other processes"
    assert said in output
    # The launcher's own bookkeeping: both processes reaped, their process groups empty.
    assert launcher.children[1].returncode == -signal.SIGKILL
    assert all(child.returncode is not None for child in launcher.children)
    assert launcher.alive() == []


@pytest.mark.timeout(120)
def test_a_process_that_raises_stops_the_run_and_shows_its_traceback():
    started = time.monotonic()
    done = subprocess.run(
        [*LAUNCH, "--timeout", "100", *failures_script("raises")],
        capture_output=True,
        text=True,
        timeout=110,
    )
    elapsed = time.monotonic() - started
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert elapsed < 60, (elapsed, output)
    assert "[1] Traceback (most recent call last):" in done.stderr
    assert '[1]     raise ValueError("process 1 fails on purpose")' in done.stderr
    assert "[1] ValueError: process 1 fails on purpose" in done.stderr
    assert "fastpjit.launch: process 1 raised ValueError; stopping the other processes" in output
    assert "the collective finished" not in output
    for pgid in map(int, re.findall(r"ready pid \d+ pgid (\d+)", output)):
        assert gone(pgid)


class WaitingRun:
    """A launch of `multiprocess_failures.py waits`, once process 0 is blocked in a collective
    that process 1 never joins: `act(launcher, pids)` then stops something, and the run's
    exit status, seconds from the act to the launcher's exit, and stdout and stderr are
    kept."""

    def __init__(self, act, env=None) -> None:
        lines: list[str] = []
        with subprocess.Popen(
            [*LAUNCH, "--timeout", "100", *failures_script("waits")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        ) as launcher:
            reader = threading.Thread(target=lambda: lines.extend(launcher.stdout), daemon=True)
            reader.start()
            try:
                deadline = time.monotonic() + 90
                while time.monotonic() < deadline and not (
                    any("entering the collective" in line for line in lines)
                    and sum("ready pid" in line for line in lines) == 2
                ):
                    time.sleep(0.1)
                assert any("entering the collective" in line for line in lines), lines
                time.sleep(1)  # process 0 is blocked in the collective, process 1 asleep
                pids = {
                    int(index): int(pid)
                    for index, pid in re.findall(r"\[(\d)\] ready pid (\d+)", "".join(lines))
                }
                acted = time.monotonic()
                act(launcher, pids)
                self.status = launcher.wait(timeout=STOP_GRACE_S + 20)
                self.elapsed = time.monotonic() - acted
            finally:
                if launcher.poll() is None:
                    launcher.kill()
            reader.join(timeout=5)
            self.stdout, self.stderr = "".join(lines), launcher.stderr.read()


@pytest.mark.timeout(120)
def test_ctrl_c_stops_every_process():
    run = WaitingRun(lambda launcher, _: launcher.send_signal(signal.SIGINT))
    assert run.status == 128 + signal.SIGINT, run.stderr
    assert run.elapsed < STOP_GRACE_S + 10, run.elapsed
    assert "fastpjit.launch: SIGINT received; stopping every process" in run.stderr
    pgids = [int(g) for g in re.findall(r"ready pid \d+ pgid (\d+)", run.stdout)]
    assert len(pgids) == 2
    assert all(gone(pgid) for pgid in pgids)


@pytest.mark.timeout(120)
def test_sigterm_ends_a_process_blocked_in_a_collective_at_once():
    # As SLURM stops a failed job's other processes: JAX's preemption notifier would take the
    # signal, and the process would wait on in its collective.
    run = WaitingRun(lambda _, pids: os.kill(pids[0], signal.SIGTERM))
    said = "fastpjit.launch: process 0 was killed by SIGTERM; stopping the other processes"
    assert said in run.stderr, run.stderr
    assert run.status == 128 + signal.SIGTERM, run.stderr
    assert run.elapsed < STOP_GRACE_S, run.elapsed  # before the launcher's own grace period


@pytest.mark.timeout(120)
def test_jax_enable_preemption_service_keeps_jax_s_handling_of_sigterm():
    def term_then_interrupt(launcher, pids):
        os.kill(pids[0], signal.SIGTERM)
        time.sleep(2)
        assert launcher.poll() is None, "process 0 ended on SIGTERM"
        launcher.send_signal(signal.SIGINT)

    run = WaitingRun(term_then_interrupt, env={**os.environ, "JAX_ENABLE_PREEMPTION_SERVICE": "1"})
    assert run.status == 128 + signal.SIGINT, run.stderr
    assert "fastpjit.launch: SIGINT received; stopping every process" in run.stderr


# --- Processes that no engine started: JAX_* variables --------------------------------------

ENGINE_VARIABLES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "FASTPJIT_", "JAX_", "KUBERNETES_")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.timeout(150)
@pytest.mark.parametrize("kind", ["jax_variables", "kubernetes_indexed_job"])
def test_processes_find_each_other_in_jax_s_variables(kind):
    address = f"127.0.0.1:{free_port()}"
    base = {k: v for k, v in os.environ.items() if not k.startswith(ENGINE_VARIABLES)}
    base.update(
        JAX_COORDINATOR_ADDRESS=address,
        JAX_COORDINATOR_BIND_ADDRESS=address,
        JAX_NUM_PROCESSES="2",
        JAX_NUM_CPU_DEVICES="4",
        JAX_PLATFORMS="cpu",
    )
    processes = []
    for index in range(2):
        if kind == "jax_variables":
            env = {**base, "JAX_PROCESS_ID": str(index)}
        else:  # a pod of an Indexed Job: JAX's Kubernetes detector needs jax[k8s], not here
            env = {
                **base,
                "KUBERNETES_SERVICE_HOST": "10.0.0.1",
                "JOB_COMPLETION_INDEX": str(index),
                "HOSTNAME": f"train-{index}-x7k2q",
            }
        processes.append(
            subprocess.Popen(
                [sys.executable, str(HERE / "multiprocess_variables.py")],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outputs = [p.communicate(timeout=120) for p in processes]
    for index, (process, (out, err)) in enumerate(zip(processes, outputs, strict=True)):
        assert process.returncode == 0, err[-4000:]
        # 4 devices of 1s and 4 of 2s.
        assert f"process {index} of 2: total 12.0" in out, (out, err[-4000:])


# --- Mutual TLS with the coordinator ---------------------------------------------------------


def certificates(directory) -> dict[str, str]:
    """A certificate authority and one certificate for 127.0.0.1 that it signed, made by
    openssl, as the launcher's --mtls-* options take them."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, capture_output=True, check=True)

    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=fastpjit test CA",
    )
    openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "node.key",
        "-out",
        "node.csr",
        "-subj",
        "/CN=localhost",
    )
    (directory / "ext.cnf").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n"
    )
    openssl(
        "x509",
        "-req",
        "-in",
        "node.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "node.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    )
    return {
        "--mtls-cert-file": str(directory / "node.pem"),
        "--mtls-key-file": str(directory / "node.key"),
        "--mtls-ca-file": str(directory / "ca.pem"),
    }


@pytest.mark.timeout(150)
def test_the_launcher_passes_mutual_tls_through_where_jax_has_it(tmp_path):
    options = [arg for pair in certificates(tmp_path).items() for arg in pair]
    done = subprocess.run(
        [*LAUNCH, *options, "--timeout", "100", str(HERE / "multiprocess_variables.py")],
        capture_output=True,
        text=True,
        timeout=130,
        check=False,
    )
    if ON_0_10:  # jax 0.10.2 would ignore JAX_MTLS_*: the launcher refuses
        assert done.returncode == 2, done.stderr
        assert "--mtls-cert-file: this JAX has no mutual TLS for jax.distributed's" in done.stderr
        return
    assert done.returncode == 0, done.stderr[-4000:]
    assert "[0] process 0 of 2: total 12.0" in done.stdout, done.stdout
    # A process without its certificate cannot join.
    ca_only = ["--mtls-ca-file", str(tmp_path / "ca.pem")]
    done = subprocess.run(
        [*LAUNCH, *ca_only, "--timeout", "100", str(HERE / "multiprocess_variables.py")],
        capture_output=True,
        text=True,
        timeout=130,
        check=False,
    )
    assert done.returncode != 0 and "total" not in done.stdout, done.stdout
    assert "mTLS configuration is missing the certificate" in done.stderr, done.stderr[-4000:]
