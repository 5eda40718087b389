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
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fastpjit.launch import STOP_GRACE_S, Launcher

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


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
@pytest.mark.parametrize(
    "name",
    [
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
    ],
)
def test_two_processes_agree_with_jax(checks, name):
    checks.assert_passed(name)


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


@pytest.mark.timeout(120)
def test_ctrl_c_stops_every_process():
    lines: list[str] = []
    with subprocess.Popen(
        [*LAUNCH, "--timeout", "100", *failures_script("waits")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as launcher:

        def read() -> None:
            for line in launcher.stdout:
                lines.append(line)

        reader = threading.Thread(target=read, daemon=True)
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
            interrupted = time.monotonic()
            launcher.send_signal(signal.SIGINT)
            status = launcher.wait(timeout=STOP_GRACE_S + 20)
            elapsed = time.monotonic() - interrupted
        finally:
            if launcher.poll() is None:
                launcher.kill()
        reader.join(timeout=5)
        errors = launcher.stderr.read()
    assert status == 128 + signal.SIGINT, errors
    assert elapsed < STOP_GRACE_S + 10, elapsed
    assert "fastpjit.launch: SIGINT received; stopping every process" in errors
    pgids = [int(g) for line in lines for g in re.findall(r"ready pid \d+ pgid (\d+)", line)]
    assert len(pgids) == 2
    assert all(gone(pgid) for pgid in pgids)
