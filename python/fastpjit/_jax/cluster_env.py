"""fastpjit's part in `jax.distributed.initialize()`, registered on import: the cluster
environments of the processes that `python -m fastpjit.launch` starts and of engines that JAX
detects no cluster of (Kubeflow, Ray), and a hook after each initialization."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

from jax._src import clusters as _clusters
from jax._src import distributed as _distributed

from fastpjit import _launched

# jax.distributed.initialize() with no arguments asks JAX's cluster environments (SLURM, Open
# MPI, Kubernetes, ...) for the coordinator address, the process count and this process's id,
# and takes the first one present in the order of `ClusterEnv._cluster_types` (JAX registers
# each subclass as it is defined).


class LaunchedCluster(_clusters.ClusterEnv):
    """The processes of one `python -m fastpjit.launch` run, all on this machine. Moved first,
    so that a launch inside, say, a SLURM allocation is not taken for the allocation's job."""

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


# The variables that Kubeflow's trainer, Ray's JaxTrainer and most launch scripts set, of which
# JAX reads only the first; and the index that a Kubernetes Indexed Job gives each pod.
COORDINATOR_ADDRESS = "JAX_COORDINATOR_ADDRESS"
NUM_PROCESSES = "JAX_NUM_PROCESSES"
PROCESS_ID = "JAX_PROCESS_ID"
JOB_COMPLETION_INDEX = "JOB_COMPLETION_INDEX"


class JaxVariablesCluster(_clusters.ClusterEnv):
    """Processes given `JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES` and their id, in
    `JAX_PROCESS_ID` or else (a Kubernetes Indexed Job's pod) `JOB_COMPLETION_INDEX`. Tried
    last: a cluster that JAX detects (SLURM, Open MPI, a Kubernetes Job with jax[k8s]) is
    taken as JAX takes it."""

    name = "jax-variables"

    @classmethod
    def is_env_present(cls) -> bool:
        return (
            COORDINATOR_ADDRESS in os.environ
            and NUM_PROCESSES in os.environ
            and (PROCESS_ID in os.environ or JOB_COMPLETION_INDEX in os.environ)
        )

    @classmethod
    def get_coordinator_address(
        cls, timeout_secs: int | None, override_coordinator_port: str | None
    ) -> str:
        return os.environ[COORDINATOR_ADDRESS]

    @classmethod
    def get_process_count(cls) -> int:
        return _integer(NUM_PROCESSES)

    @classmethod
    def get_process_id(cls) -> int:
        return _integer(PROCESS_ID if PROCESS_ID in os.environ else JOB_COMPLETION_INDEX)

    @classmethod
    def get_local_process_id(cls) -> int | None:
        return None


def _integer(name: str) -> int:
    value = os.environ[name]
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None


_clusters.ClusterEnv._cluster_types.remove(LaunchedCluster)
_clusters.ClusterEnv._cluster_types.insert(0, LaunchedCluster)
_clusters.ClusterEnv._cluster_types.remove(JaxVariablesCluster)
_clusters.ClusterEnv._cluster_types.append(JaxVariablesCluster)


def around_initialize(wrapper: Callable[..., None]) -> None:
    """Makes every `jax.distributed.initialize()` run through `wrapper(initialize, *args,
    **kwargs)`, where `initialize` is JAX's (what the public function calls)."""
    state = _distributed.global_state
    state.initialize = functools.partial(wrapper, state.initialize)  # type: ignore[method-assign]


def processes() -> int:
    """How many processes jax.distributed joins this one to (1 where it is not initialized)."""
    state = _distributed.global_state
    return state.num_processes if state.client is not None else 1


def preemption_notified() -> bool:
    """Whether JAX's preemption service runs, whose notifier took SIGTERM's handling."""
    return _distributed.global_state.preemption_sync_manager is not None
