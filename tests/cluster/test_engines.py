"""fastpjit's multi-process support under the engines that clusters run, for real: a one-machine
SLURM cluster (`srun`) and Open MPI (`mpirun`), 2 processes × 4 CPU devices on loopback.

The same scripts as under `python -m fastpjit.launch` (`tests/multiprocess_checks.py`,
`tests/multiprocess_failures.py`), unchanged: JAX's own detection of each engine joins the
processes.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import engines
import pytest
from test_multiprocess import CHECKS, one_process_results

# Jobs of JAX processes under SLURM and Open MPI: seconds each.
pytestmark = [pytest.mark.slow, pytest.mark.subprocess, pytest.mark.multiprocess]

TESTS = Path(__file__).parent.parent
# How each engine labels what a process prints: srun's `--label` at the start of each line,
# mpirun's `--tag-output` at the start of each piece it relays (a line's end may come apart).
LABELS = {"srun": r"(?m)^(\d+): ", "mpirun": r"\[\d+,(\d+)\]<stdout>:"}
JOB_TIMEOUT_S = 240
# How long after a process fails the whole job may take to end.
ENDS_WITHIN_S = 10


def command(engine: str, slurm: engines.Slurm | None, argv: list[str]) -> list[str]:
    if engine == "srun":
        assert slurm is not None
        return slurm.srun(argv)
    return engines.mpirun(argv)


@pytest.fixture(params=["srun", "mpirun"])
def engine(request, installed) -> tuple[str, engines.Slurm | None]:
    if request.param == "srun":
        return "srun", request.getfixturevalue("slurm")
    return "mpirun", None


def run(engine: tuple[str, engines.Slurm | None], argv: list[str]) -> tuple[int, str, float]:
    """Runs `argv` as a job of the engine: its exit status, output, and when it ended."""
    name, slurm = engine
    done = subprocess.run(
        command(name, slurm, argv),
        env=slurm.env() if slurm is not None else None,
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr, time.time()


@pytest.mark.timeout(JOB_TIMEOUT_S + 60)
def test_every_multiprocess_check_passes_in_both_processes(engine):
    status, output, _ = run(engine, engines.python(TESTS / "multiprocess_checks.py"))
    verdicts: dict[int, dict[str, str]] = {}
    for process, name, verdict in re.findall(
        LABELS[engine[0]] + r"CHECK (\w+) (ok|FAILED)", output
    ):
        verdicts.setdefault(int(process), {})[name] = verdict
    report = f"{engine[0]} exited {status}; output:\n{output[-12000:]}"
    assert sorted(verdicts) == [0, 1], report
    for process in (0, 1):
        assert verdicts[process] == dict.fromkeys(CHECKS, "ok"), report
    assert status == 0, report
    # The global results equal those of one process computing them on 8 devices.
    expected = one_process_results()
    results: dict[int, dict[str, str]] = {}
    for process, name, found in re.findall(LABELS[engine[0]] + r"RESULT (\w+) ([\w-]+)", output):
        results.setdefault(int(process), {})[name] = found
    assert results == {0: expected, 1: expected}, report


@pytest.mark.timeout(JOB_TIMEOUT_S + 60)
@pytest.mark.parametrize("mode", ["raises", "killed"])
def test_a_failed_process_ends_the_job_within_seconds(engine, mode):
    # Process 1 fails while process 0 waits for it in a collective; the engine ends the job
    # (mpirun aborts it; srun, with --kill-on-bad-exit, sends SIGTERM to process 0, which
    # JAX's preemption notifier would otherwise take).
    status, output, ended = run(engine, engines.python(TESTS / "multiprocess_failures.py", mode))
    # mpirun tags each piece it relays: a line can come apart ("ValueError[1,1]<stderr>:: ...").
    output = re.sub(r"\[\d+,\d+\]<std(?:out|err)>:", "", output)
    report = f"{engine[0]} exited {status}; output:\n{output[-6000:]}"
    failed_at = re.search(r"failing at ([\d.]+)", output)
    assert failed_at is not None, report
    took = ended - float(failed_at.group(1))
    print(f"{engine[0]}, process 1 {mode}: the job ended {took:.1f} s later, status {status}")
    assert status != 0, report
    assert "the collective finished" not in output, report
    assert took < ENDS_WITHIN_S, report
    if mode == "raises":
        assert "ValueError: process 1 fails on purpose" in output, report


# The batch script of docs/multiprocess.md, with this interpreter and script.
BATCH_SCRIPT = """#!/bin/bash
#SBATCH --ntasks=2
#SBATCH --output=job.out
export JAX_NUM_CPU_DEVICES=4 JAX_PLATFORMS=cpu
srun --kill-on-bad-exit=1 {python} {script}
"""


@pytest.mark.timeout(JOB_TIMEOUT_S + 60)
def test_a_batch_script_runs_its_processes_as_one_program(slurm, tmp_path):
    script = tmp_path / "train.sbatch"
    script.write_text(
        BATCH_SCRIPT.format(python=sys.executable, script=TESTS / "multiprocess_variables.py")
    )
    done = slurm.sbatch(script)
    output = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert done.returncode == 0, (done.stdout, done.stderr, output)
    for index in (0, 1):
        assert f"process {index} of 2: total 12.0" in output, output
