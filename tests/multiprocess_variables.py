"""One process of a two-process run that no engine started: `jax.distributed.initialize()` with
no arguments finds the coordinator, the process count and this process's id in the variables
that Kubeflow, Ray and launch scripts set (`JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`,
`JAX_PROCESS_ID` or a Kubernetes Indexed Job's `JOB_COMPLETION_INDEX`), once fastpjit is
imported. Prints the process's index and count and a sum over both processes' devices."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import fastpjit

jax.distributed.initialize()
mesh = jax.make_mesh((jax.device_count(),), ("x",))
rows = np.full(jax.local_device_count(), jax.process_index() + 1, np.float32)
x = fastpjit.make_array_from_process_local_data(NamedSharding(mesh, P("x")), rows)
total = fastpjit.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))(x)
print(f"process {jax.process_index()} of {jax.process_count()}: total {float(total)}", flush=True)
