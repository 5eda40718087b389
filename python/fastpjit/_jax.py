"""The one module that touches JAX's and jaxlib's private APIs.

A JAX upgrade that moves any of these names should need changes here and nowhere else.
"""

from __future__ import annotations

from typing import Any, Sequence

from jax._src import sharding as _sharding
from jax._src import named_sharding as _named_sharding
from jax._src.lib import xla_client as xc
from jax._src.sharding_impls import GSPMDSharding

IndivisibleError = _sharding.IndivisibleError
DuplicateSpecError = _named_sharding.DuplicateSpecError

__all__ = [
    "DuplicateSpecError",
    "GSPMDSharding",
    "IndivisibleError",
    "gspmd_sharding",
    "hlo_parts",
    "logical_device_ids",
]


def hlo_parts(sharding: Any, ndim: int) -> tuple[str, tuple[Any, ...]]:
    """The HLO sharding text and device assignment of any JAX sharding."""
    return str(sharding._to_xla_hlo_sharding(ndim)), tuple(sharding._device_assignment)


def logical_device_ids(sharding: Any) -> tuple[int, ...] | None:
    """The device order that a NamedSharding lays over its mesh, if it sets one."""
    return sharding._logical_device_ids


def gspmd_sharding(devices: Sequence[Any], hlo_text: str) -> GSPMDSharding:
    """A GSPMDSharding over `devices` from text that fastpjit's parser has checked."""
    return GSPMDSharding(tuple(devices), xc.HloSharding.from_string(hlo_text))
