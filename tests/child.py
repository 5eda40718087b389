"""A test script run in a child process, which answers with JSON on its last line of output."""

import json
import os
import subprocess
import sys


def run_json(script, *argv, timeout=240, **env):
    """Runs `python script *argv` with `env` added to the environment; checks that it exits
    with 0 and returns the JSON value of its last line."""
    done = subprocess.run(
        [sys.executable, script, *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
