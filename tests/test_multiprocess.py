"""Multi-controller JAX: two processes on loopback with 4 CPU devices each.

The test starts this file twice as a script (`python test_multiprocess.py PROCESS_ID PORT`);
each process joins the other through `jax.distributed.initialize` and checks fastpjit's index
maps against JAX's over all 8 global devices, then jit, device_put and pmap on arrays that
span both processes. CPU collectives default to gloo in this JAX, and nothing here runs a
collective, so no collectives flag is set.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import traceback

import jax
import numpy as np
from jax._src.sharding_impls import device_replica_id_map
from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

import fastpjit

NUM_PROCESSES = 2
LOCAL_DEVICES = 4
PAIR_TIMEOUT_S = 90
ATTEMPTS = 2
MISMATCH = "FASTPJIT-MISMATCH"
PASSED = "FASTPJIT-PASSED"


# --- The worker: runs inside each of the two processes ------------------------------------


def check_against_jax(sharding, shape, local_devices):
    ours = fastpjit.devices_indices_map(sharding, shape)
    assert ours == sharding.devices_indices_map(shape), sharding
    assert list(ours) == list(sharding.devices_indices_map(shape)), sharding
    assert set(ours) == set(sharding.device_set)

    ours_local = fastpjit.addressable_devices_indices_map(sharding, shape)
    assert ours_local == sharding.addressable_devices_indices_map(shape), sharding
    assert set(ours_local) == set(ours) & set(local_devices), sharding
    assert all(d.process_index == jax.process_index() for d in ours_local)

    assert fastpjit.shard_shape(sharding, shape) == sharding.shard_shape(shape)
    assert fastpjit.device_replica_id_map(sharding, shape) == device_replica_id_map(
        sharding, shape
    )
    expected = [
        [[s.start or 0, n if s.stop is None else s.stop] for s, n in zip(index, shape, strict=True)]
        for index in (ours[d] for d in sharding._device_assignment)
    ]
    np.testing.assert_array_equal(
        fastpjit.indices_array(sharding, shape),
        np.array(expected, dtype=np.int64).reshape(len(expected), len(shape), 2),
    )
    return ours, ours_local


def assert_same_global_array(ours, theirs):
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    assert ours.sharding == theirs.sharding, (ours.sharding, theirs.sharding)
    assert ours.committed == theirs.committed
    ours_shards = sorted(ours.addressable_shards, key=lambda s: s.device.id)
    theirs_shards = sorted(theirs.addressable_shards, key=lambda s: s.device.id)
    assert [(s.device, s.index) for s in ours_shards] == [
        (s.device, s.index) for s in theirs_shards]
    for a, b in zip(ours_shards, theirs_shards, strict=True):
        np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data))


def check_dispatch(mesh, local):
    """jit (compiled by fastpjit, then its Rust fast path), device_put and pmap across the two
    processes, against JAX."""
    sharding = NamedSharding(mesh, P("x", "y"))
    host = np.arange(64, dtype=np.float32).reshape(8, 8)
    x = jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    def affine(a, b):
        return a * 2 + b, a.T

    ours, theirs = fastpjit.jit(affine), jax.jit(affine)
    before = fastpjit.stats()
    for _ in range(3):  # a miss, then hits
        for mine, expected in zip(ours(x, 1.5), theirs(x, 1.5), strict=True):
            assert_same_global_array(mine, expected)
    after = fastpjit.stats()
    assert after["cache_hits"] - before["cache_hits"] == 2
    assert after["compiles"] - before["compiles"] == 1
    assert after["fallbacks"] == before["fallbacks"], after["fallbacks"]

    assert_same_global_array(fastpjit.device_put(host, sharding), jax.device_put(host, sharding))
    replicated = NamedSharding(mesh, P())
    assert_same_global_array(fastpjit.device_put(host, replicated),
                             jax.device_put(host, replicated))

    per_process = np.arange(LOCAL_DEVICES * 3, dtype=np.float32).reshape(LOCAL_DEVICES, 3)
    pmapped = fastpjit.pmap(lambda v: v * 3 + jax.process_index())
    expected = jax.pmap(lambda v: v * 3 + jax.process_index())(per_process)
    assert_same_global_array(pmapped(per_process), expected)
    assert {s.device for s in expected.addressable_shards} == set(local)


def worker(process_id, port):
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=NUM_PROCESSES,
        process_id=process_id,
        initialization_timeout=45,
        shutdown_timeout_seconds=30,
    )
    try:
        devices = jax.devices()
        local = jax.local_devices()
        assert jax.process_index() == process_id
        assert len(devices) == NUM_PROCESSES * LOCAL_DEVICES, devices
        assert len(local) == LOCAL_DEVICES and all(d.process_index == process_id for d in local)

        mesh = Mesh(np.array(devices).reshape(2, 4), ("x", "y"))
        # Devices of the two processes interleaved along every mesh axis.
        by_process = sorted(devices, key=lambda d: (d.id % LOCAL_DEVICES, d.process_index))
        interleaved = Mesh(np.array(by_process).reshape(2, 2, 2), ("a", "b", "c"))
        made = jax.make_mesh((4, 2), ("x", "y"))
        remote = [d for d in devices if d.process_index != process_id]
        remote_only = Mesh(np.array(remote).reshape(2, 2), ("x", "y"))
        cases = [
            (NamedSharding(mesh, P("x", "y")), (8, 8)),
            (NamedSharding(mesh, P("y", "x")), (8, 4)),
            (NamedSharding(mesh, P(("x", "y"))), (16, 3)),
            (NamedSharding(mesh, P(None, "y")), (2, 4)),
            (NamedSharding(mesh, P()), (5, 3)),
            (NamedSharding(mesh, P()), ()),
            (NamedSharding(interleaved, P("c", ("b", "a"))), (2, 8)),
            (NamedSharding(interleaved, P("b")), (6,)),
            (NamedSharding(made, P("y", "x")), (4, 8)),
            (NamedSharding(remote_only, P("x")), (4, 4)),
            (SingleDeviceSharding(remote[0]), (3, 3)),
            (SingleDeviceSharding(local[-1]), (3, 3)),
            (fastpjit.parse_hlo_sharding("{devices=[2,1,4]<=[8] last_tile_dim_replicate}",
                                         devices), (4, 6)),
            (fastpjit.parse_hlo_sharding("{devices=[4,2]<=[2,4]T(1,0)}", by_process), (8, 2)),
        ]
        for sharding, shape in cases:
            check_against_jax(sharding, shape, local)

        everything, mine = check_against_jax(cases[0][0], (8, 8), local)
        assert set(everything) == set(devices)
        assert set(mine) == set(local)
        none_mine = fastpjit.addressable_devices_indices_map(cases[9][0], (4, 4))
        assert none_mine == {}
        check_dispatch(mesh, local)
        print(PASSED, process_id, len(cases), flush=True)
    except BaseException:  # a pyo3 PanicException derives from BaseException
        print(MISMATCH, process_id, flush=True)
        traceback.print_exc()
        sys.stdout.flush()
        return 1
    finally:
        jax.distributed.shutdown()
    return 0


# --- The test: starts two workers and bounds them in time ---------------------------------


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_pair():
    """Runs both workers; returns (return codes, outputs), with None for one that timed out."""
    env = {
        **os.environ,
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={LOCAL_DEVICES}",
        "JAX_PLATFORMS": "cpu",
    }
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), str(i), str(port)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(NUM_PROCESSES)
    ]
    deadline = time.monotonic() + PAIR_TIMEOUT_S
    codes, outputs = [], []
    try:
        for proc in procs:
            try:
                out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
                codes.append(proc.returncode)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
                codes.append(None)
            outputs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return codes, outputs


def test_two_processes_see_global_and_addressable_maps_and_dispatch_like_jax():
    for attempt in range(ATTEMPTS):
        codes, outputs = run_pair()
        report = "\n".join(
            f"--- process {i} (exit {code}) ---\n{out[-6000:]}"
            for i, (code, out) in enumerate(zip(codes, outputs, strict=True))
        )
        if any(MISMATCH in out for out in outputs):
            raise AssertionError(f"fastpjit disagrees with JAX:\n{report}")
        if codes == [0, 0]:
            for i, out in enumerate(outputs):
                assert f"{PASSED} {i}" in out, report
            return
        if None in codes:
            raise AssertionError(f"timed out after {PAIR_TIMEOUT_S} s:\n{report}")
        # A start-up failure (a port taken between choosing and binding it) is retried once;
        # a mismatch or a time-out never is.
        if attempt == ATTEMPTS - 1:
            raise AssertionError(f"the two processes did not finish cleanly:\n{report}")


if __name__ == "__main__":
    sys.exit(worker(int(sys.argv[1]), int(sys.argv[2])))
