"""The cluster environment of the processes that `python -m fastpjit.launch` starts, registered
with jax.distributed on import (the launcher and `fastpjit._launched` set its variables)."""

from __future__ import annotations

import os

from jax._src import clusters as _clusters

from fastpjit import _launched

# jax.distributed.initialize() with no arguments asks JAX's cluster environments (SLURM, Open
# MPI, Kubernetes, ...) for the coordinator address, the process count and this process's id.
# The launcher passes them in environment variables (fastpjit._launched); this environment
# reads them. JAX registers each ClusterEnv subclass as it is defined and takes the first one
# present in that order: this one is moved first, so that a launch inside, say, a SLURM
# allocation is not taken for the allocation's own job.


class LaunchedCluster(_clusters.ClusterEnv):
    """The processes of one `python -m fastpjit.launch` run, all on this machine."""

    name = "fastpjit"

    @classmethod
    def is_env_present(cls) -> bool:
        return _launched.launched()

    @classmethod
    def get_coordinator_address(
        cls, timeout_secs: int | None, override_coordinator_port: str | None
    ) -> str:
        return os.environ[_launched.COORDINATOR_ADDRESS]

    @classmethod
    def get_process_count(cls) -> int:
        return int(os.environ[_launched.NUM_PROCESSES])

    @classmethod
    def get_process_id(cls) -> int:
        return int(os.environ[_launched.PROCESS_ID])

    @classmethod
    def get_local_process_id(cls) -> int | None:
        # Every process is on this machine. JAX then shows each one GPU, the one of its index,
        # unless JAX_LOCAL_DEVICE_IDS (set by --local-devices) names others; as it does under
        # SLURM and Open MPI. The CPU ignores it.
        return cls.get_process_id()


_clusters.ClusterEnv._cluster_types.remove(LaunchedCluster)
_clusters.ClusterEnv._cluster_types.insert(0, LaunchedCluster)
