"""Test set-up: 8 CPU devices, and a hypothesis profile chosen by FASTPJIT_HYPOTHESIS_PROFILE."""

import os

# Must be set before jax initialises its backends.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "ci", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=40, deadline=None)
settings.register_profile(
    "thorough", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("FASTPJIT_HYPOTHESIS_PROFILE", "ci"))

# The cluster tests start SLURM's daemons and Open MPI jobs: `make test-cluster` runs them.
collect_ignore = [] if os.environ.get("FASTPJIT_CLUSTER_TESTS") else ["cluster"]
