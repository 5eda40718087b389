"""Index maps of JAX shardings, computed by fastpjit's Rust core.

Each function takes any `jax.sharding.Sharding` (NamedSharding over a Mesh or an AbstractMesh,
SingleDeviceSharding, GSPMDSharding, or one made by `parse_hlo_sharding`) and a global shape.
As in JAX, an unreduced sharding (whose devices hold partial sums) has a shard shape but no
index map; `device_placement_map` describes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jax.errors import JaxRuntimeError

from fastpjit._core import (
    addressable_devices_indices_map,
    canonical_hlo_sharding,
    device_placement_map,
    device_replica_id_map,
    devices_indices_map,
    indices_array,
    shard_shape,
)
from fastpjit._jax.xla_compile import GSPMDSharding, gspmd_sharding

__all__ = [
    "addressable_devices_indices_map",
    "device_placement_map",
    "device_replica_id_map",
    "devices_indices_map",
    "indices_array",
    "parse_hlo_sharding",
    "shard_shape",
]


def parse_hlo_sharding(text: str, devices: Sequence[Any]) -> GSPMDSharding:
    """The sharding that HLO text such as `{devices=[4,2]<=[8]}` describes over `devices`.

    The text is read by fastpjit's own parser, with XLA's grammar, which names the column where
    malformed text goes wrong (ValueError); the result is a JAX GSPMDSharding, usable wherever
    JAX takes a sharding. Text on which XLA's own parser would crash is refused.
    """
    devices = tuple(devices)
    canonical = canonical_hlo_sharding(text, len(devices))
    try:
        return gspmd_sharding(devices, canonical)
    except JaxRuntimeError as e:
        # A guard: the parser reads XLA's grammar, and the fuzz tests find no text that it reads
        # and XLA refuses; should XLA refuse one, its verdict is reported the same way.
        raise ValueError(f"XLA rejects the HLO sharding {text!r}: {e}") from e
