"""GSPMD shardings and `parse_hlo_sharding`, differential against JAX and XLA on 8 CPU devices.

The oracle for a text is `GSPMDSharding(devices, xc.HloSharding.from_string(text))`: XLA's
parser and JAX's index maps. XLA's parser aborts the process on some texts, so texts that are
not known to be safe go to XLA in another process (`xla_oracle`). The parser is also fuzzed:
whatever the text, it raises ValueError naming the column or reads what XLA reads, never panics
and never crashes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections import defaultdict

import jax
import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from index_oracle import DEVICES, INDEX_MAP_FUNCTIONS, assert_matches_jax
from jax._src import sharding as jax_sharding
from jax._src.lib import xla_client as xc
from jax._src.sharding_impls import GSPMDSharding
from jax._src.sharding_impls import device_replica_id_map as jax_device_replica_id_map
from lines import by_line
from xla_oracle import xla_verdict

import fastpjit
from fastpjit import _core
from fastpjit.sharding import device_placement_map


def param_id(value):
    """Short test ids: a device tuple reads as its ids (`d3705`)."""
    if isinstance(value, tuple) and value and all(hasattr(d, "platform") for d in value):
        return "d" + "".join(str(d.id) for d in value)
    return str(value)


def gspmd(text, devices=DEVICES):
    """The oracle: XLA's parser and JAX's GSPMDSharding."""
    return GSPMDSharding(tuple(devices), xc.HloSharding.from_string(text))


def assert_parses_like_xla(text, devices, shape):
    """parse_hlo_sharding gives XLA's sharding, and both index like JAX."""
    theirs = gspmd(text, devices)
    ours = fastpjit.parse_hlo_sharding(text, devices)
    assert isinstance(ours, GSPMDSharding)
    assert ours == theirs
    assert ours._device_assignment == theirs._device_assignment
    assert_matches_jax(theirs, shape)
    assert_matches_jax(ours, shape)


def assert_shard_properties(sharding, shape, replicas):
    """Each element lies in `replicas` shards, each shard has the shard shape, and replica ids
    count 0..r-1 among the devices holding one index."""
    index_map = fastpjit.devices_indices_map(sharding, shape)
    shard = fastpjit.shard_shape(sharding, shape)
    hits = np.zeros(shape, dtype=np.int64)
    for index in index_map.values():
        assert hits[index].shape == shard
        hits[index] += 1
    assert (hits == replicas).all()
    replica_ids = fastpjit.device_replica_id_map(sharding, shape)
    holders = defaultdict(list)
    for device, index in index_map.items():
        holders[tuple((s.start, s.stop) for s in index)].append(replica_ids[device])
    assert all(ids == list(range(replicas)) for ids in holders.values())


# --- Fixed cases ---------------------------------------------------------------------------

REVERSED = DEVICES[::-1]
SCRAMBLED = tuple(DEVICES[i] for i in (3, 7, 0, 5, 2, 6, 1, 4))
FOUR = tuple(DEVICES[i] for i in (5, 2, 7, 0))

CASES = [
    ("{replicated}", DEVICES, (4, 6)),
    ("{replicated}", FOUR, ()),
    ("{maximal device=0}", DEVICES, (3, 5)),
    ("{maximal device=5}", SCRAMBLED, (3,)),
    ("{maximal device=0}", DEVICES[2:3], ()),
    ("{devices=[8]<=[8]}", DEVICES, (16,)),
    ("{devices=[4,2]<=[8]}", SCRAMBLED, (8, 4)),
    ("{devices=[2,4]<=[2,4]T(1,0)}", DEVICES, (4, 8)),
    ("{devices=[8,1]<=[2,4]T(1,0)}", REVERSED, (8, 3)),
    ("{devices=[2,2,2]<=[2,2,2]T(2,0,1)}", SCRAMBLED, (2, 4, 6)),
    ("{devices=[2,1,4]<=[8] last_tile_dim_replicate}", DEVICES, (4, 5)),
    ("{devices=[2,1,4]<=[4,2]T(1,0) last_tile_dim_replicate}", SCRAMBLED, (4, 5)),
    ("{devices=[2,4]<=[8] last_tile_dims={replicated}}", DEVICES, (6,)),
    ("{devices=[1,2,4]<=[2,2,2]T(1,2,0) last_tile_dims={replicated}}", REVERSED, (7, 2)),
    ("{devices=[2,4]7,6,5,4,3,2,1,0}", DEVICES, (2, 8)),
    ("{devices=[2,2,2]0,4,1,5,2,6,3,7}", SCRAMBLED, (2, 2, 2)),
    ("{devices=[4,1,2]3,0,2,1,7,4,6,5 last_tile_dim_replicate}", DEVICES, (8, 1)),
    ("{devices=[2,2]<=[4]}", FOUR, (4, 2)),
    ("{devices=[2,2]3,1,0,2}", FOUR, (2, 6)),
    ("{devices=[1,2,2]<=[4] last_tile_dim_replicate}", FOUR, (3, 4)),
    ("{devices=[2]0,1}", DEVICES[6:], (10,)),
    ('{devices=[8]<=[8] metadata={op_name="a}b" source_file="x.py" source_line=3}}', DEVICES, (8,)),
    ("{devices=[2,4]<=[8] last_tile_dims={replicated} metadata={}}", DEVICES, (2,)),
    ("{devices=[4,2]0,1,2,3,4,5,6,7}", DEVICES, (4, 2)),
]


@pytest.mark.parametrize(("text", "devices", "shape"), CASES, ids=param_id)
def test_gspmd_cases_match_jax(text, devices, shape):
    assert_parses_like_xla(text, devices, shape)


def test_readme_example():
    text = "{devices=[2,1,4]<=[8] last_tile_dim_replicate}"
    sharding = fastpjit.parse_hlo_sharding(text, DEVICES)
    assert fastpjit.shard_shape(sharding, (4, 4)) == (2, 4)
    assert set(fastpjit.device_replica_id_map(sharding, (4, 4)).values()) == {0, 1, 2, 3}


def test_named_sharding_lowered_to_gspmd_indexes_alike():
    mesh = jax.make_mesh((2, 2, 2), ("a", "b", "c"), devices=SCRAMBLED)
    named = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(("c", "a"), None))
    lowered = GSPMDSharding(tuple(mesh.devices.flat), named._to_xla_hlo_sharding(2))
    assert fastpjit.devices_indices_map(lowered, (4, 3)) == named.devices_indices_map((4, 3))
    assert_matches_jax(lowered, (4, 3))


# --- Random GSPMD shardings ----------------------------------------------------------------


def factorizations(n, k):
    if k == 0:
        return [()] if n == 1 else []
    return [
        (d, *rest) for d in range(1, n + 1) if n % d == 0 for rest in factorizations(n // d, k - 1)
    ]


def join(values):
    return ",".join(map(str, values))


@st.composite
def device_orders(draw, n):
    """XLA's device-order text for n devices: an explicit list or an iota reshape/transpose."""
    if draw(st.booleans()):
        return join(draw(st.permutations(range(n))))
    reshape = draw(st.sampled_from(factorizations(n, draw(st.integers(1, 3)))))
    if len(reshape) == 1:
        return f"<=[{n}]"
    return f"<=[{join(reshape)}]T({join(draw(st.permutations(range(len(reshape)))))})"


@st.composite
def gspmd_texts(draw):
    """(text, devices, shape, replicas) for a random tiled sharding over 2, 4 or 8 devices."""
    n = draw(st.sampled_from([8, 8, 4, 2]))
    rank = draw(st.integers(1, 3))
    subgroup = draw(
        st.sampled_from(["", " last_tile_dim_replicate", " last_tile_dims={replicated}"])
    )
    grid = draw(st.sampled_from(factorizations(n, rank + (1 if subgroup else 0))))
    text = f"{{devices=[{join(grid)}]{draw(device_orders(n))}{subgroup}}}"
    devices = tuple(draw(st.permutations(DEVICES))[:n])
    shape = tuple(parts * draw(st.integers(1, 3)) for parts in grid[:rank])
    replicas = grid[-1] if subgroup else 1
    return text, devices, shape, replicas


@given(gspmd_texts())
def test_random_gspmd_shardings_match_jax(case):
    text, devices, shape, _ = case
    assert_parses_like_xla(text, devices, shape)


@given(gspmd_texts())
def test_random_gspmd_shards_cover_each_element_once_per_replica(case):
    text, devices, shape, replicas = case
    assert_shard_properties(gspmd(text, devices), shape, replicas)


@given(gspmd_texts(), st.data())
def test_random_gspmd_indivisible_shapes_raise_jaxs_error(case, data):
    text, devices, shape, _ = case
    sharding = gspmd(text, devices)
    partitions = [d // s for d, s in zip(shape, sharding.shard_shape(shape), strict=True)]
    sharded = [axis for axis, parts in enumerate(partitions) if parts > 1]
    if not sharded:
        return
    axis = data.draw(st.sampled_from(sharded))
    parts = partitions[axis]
    bad = parts * data.draw(st.integers(0, 2)) + data.draw(st.integers(1, parts - 1))
    shape = (*shape[:axis], bad, *shape[axis + 1 :])
    with pytest.raises(jax_sharding.IndivisibleError) as theirs:
        sharding.shard_shape(shape)
    for function in INDEX_MAP_FUNCTIONS:
        with pytest.raises(fastpjit.IndivisibleError) as ours:
            function(sharding, shape)
        assert str(ours.value) == str(theirs.value)


# --- Shardings with no index map ----------------------------------------------------------

# Each of fastpjit's functions, and JAX's function for the same answer (indices_array has none:
# it is devices_indices_map as bounds).
JAX_FUNCTIONS = {
    fastpjit.devices_indices_map: lambda s, shape: s.devices_indices_map(shape),
    fastpjit.addressable_devices_indices_map: lambda s, shape: s.addressable_devices_indices_map(
        shape
    ),
    fastpjit.shard_shape: lambda s, shape: s.shard_shape(shape),
    fastpjit.device_replica_id_map: jax_device_replica_id_map,
    fastpjit.indices_array: lambda s, shape: s.devices_indices_map(shape),
}


def assert_same_outcome_as_jax(sharding, shape):
    """Each index-map function gives JAX's answer, or raises an instance of JAX's exception."""
    for ours, theirs in JAX_FUNCTIONS.items():
        try:
            expected = theirs(sharding, shape)
        except Exception as error:  # noqa: BLE001 - whatever JAX raises, ours must match
            # JAX divides by the zero tiles of {unknown} at rank 1, and fails an assertion on it
            # at every other rank; ours fails alike at every rank.
            expected_type = AssertionError if isinstance(error, ZeroDivisionError) else type(error)
            with pytest.raises(expected_type):
                ours(sharding, shape)
            continue
        if ours is fastpjit.indices_array:
            continue  # compared by assert_matches_jax where JAX answers
        assert ours(sharding, shape) == expected, ours.__name__


UNREDUCED = [
    "{devices=[2,2,2]<=[8] last_tile_dims={unreduced}}",
    "{devices=[2,1,2,2]<=[8] last_tile_dims={unreduced, replicated}}",
    "{devices=[1,1,2,4]<=[2,4]T(1,0) last_tile_dims={unreduced, replicated}}",
    "{devices=[2,1,2,2]<=[2,2,2]T(0,2,1) last_tile_dims={replicated, unreduced}}",
    "{unreduced}",
]
NO_INDEX_MAP_LIKE_JAX = [
    "{devices=[2,2,2]<=[8] last_tile_dims={manual}}",
    "{devices=[2,2,2]<=[8] last_tile_dims={manual, replicated}}",
    "{devices=[2,2,2]<=[8] last_tile_dims={maximal}}",
    "{manual}",
    "{unknown}",
]


@pytest.mark.parametrize("text", UNREDUCED + NO_INDEX_MAP_LIKE_JAX)
@pytest.mark.parametrize("shape", [(4, 4), (8, 6), (4,)], ids=str)
def test_manual_unreduced_and_unknown_raise_jaxs_errors(text, shape):
    # JAX: an unreduced sharding has a shard shape but no index map (NotImplementedError), one
    # with manual subgroups has neither (NotImplementedError), and {manual} and {unknown} fail
    # an assertion; a wrong rank fails an assertion too.
    for candidate in (gspmd(text), fastpjit.parse_hlo_sharding(text, DEVICES)):
        assert_same_outcome_as_jax(candidate, shape)


def test_no_placement_error_is_jaxs_assertion_error_and_not_implemented():
    sharding = gspmd("{manual}")
    with pytest.raises(AssertionError):
        sharding.shard_shape((4, 4))
    for function in INDEX_MAP_FUNCTIONS:
        with pytest.raises(fastpjit.NoPlacementError) as ours:
            function(sharding, (4, 4))
        assert isinstance(ours.value, NotImplementedError)
        assert "says nothing of where data lies" in str(ours.value)


def expected_members(sharding, devices):
    """Which partial sum each device holds, read off XLA's tile assignment: the device's
    coordinate along the unreduced subgroup dims."""
    hlo = sharding._hlo_sharding
    if hlo.is_unreduced():
        return {d: i for i, d in enumerate(devices)}
    dims = hlo.tile_assignment_dimensions()
    types = hlo.subgroup_types()
    grid = np.array(hlo.tile_assignment_devices()).reshape(dims)
    unreduced = [
        len(dims) - len(types) + i for i, t in enumerate(types) if t == xc.OpSharding.Type.UNREDUCED
    ]
    members = {}
    for coords in np.ndindex(*dims):
        member = 0
        for axis in unreduced:
            member = member * dims[axis] + coords[axis]
        members[devices[grid[coords]]] = member
    return members


@pytest.mark.parametrize("text", UNREDUCED)
def test_unreduced_placement_map_gives_bounds_and_partial_sums(text):
    shape = (8, 6)
    sharding = gspmd(text, SCRAMBLED)
    hlo = sharding._hlo_sharding
    ndim = len(shape)
    placement = device_placement_map(sharding, shape)
    assert list(placement) == list(SCRAMBLED)
    # The bounds are those of the sharding with every subgroup replicated, which JAX indexes.
    if hlo.is_unreduced():
        replicated = gspmd("{replicated}", SCRAMBLED)
    else:
        dims = hlo.tile_assignment_dimensions()
        grid = ",".join(map(str, [*dims[:ndim], int(np.prod(dims[ndim:]))]))
        order = ",".join(map(str, hlo.tile_assignment_devices()))
        replicated = gspmd(f"{{devices=[{grid}]{order} last_tile_dim_replicate}}", SCRAMBLED)
    assert {d: index for d, (index, _) in placement.items()} == replicated.devices_indices_map(
        shape
    )
    assert {d: member for d, (_, member) in placement.items()} == expected_members(
        sharding, SCRAMBLED
    )


def test_placement_map_of_a_sharding_that_is_not_unreduced_is_its_index_map():
    sharding = gspmd("{devices=[2,1,4]<=[4,2]T(1,0) last_tile_dim_replicate}", SCRAMBLED)
    placement = device_placement_map(sharding, (4, 6))
    assert placement == {d: (index, 0) for d, index in sharding.devices_indices_map((4, 6)).items()}


# A tuple sharding describes several values, and JAX aborts the process on its index maps,
# so parse_hlo_sharding refuses it up front.
@pytest.mark.parametrize("text", ["{{replicated}, {maximal device=0}}", "{{replicated}}", "{}"])
def test_tuple_shardings_are_not_array_shardings(text):
    with pytest.raises(ValueError, match="tuple sharding"):
        fastpjit.parse_hlo_sharding(text, DEVICES)


# --- Errors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "shape"),
    [
        ("{devices=[4,2]<=[8]}", (8,)),
        ("{devices=[4,2]<=[8]}", (8, 8, 8)),
        ("{devices=[2,1,4]<=[8] last_tile_dim_replicate}", ()),
        ("{devices=[8]<=[8]}", ()),
    ],
)
def test_rank_mismatch_raises_jaxs_assertion_error(text, shape):
    sharding = gspmd(text)
    with pytest.raises(AssertionError):
        sharding.devices_indices_map(shape)
    for function in INDEX_MAP_FUNCTIONS:
        with pytest.raises(fastpjit.ShardingRankError) as ours:
            function(sharding, shape)
        # JAX fails an assertion; ours is also the IndexError and ValueError of a NamedSharding.
        assert isinstance(ours.value, AssertionError | IndexError | ValueError)


@pytest.mark.parametrize(
    ("text", "column"),
    [
        ("{garbage}", 2),
        ("{devices=[2,2}", 14),
        ("{devices=[2,2]0,1,2,3,4}", 15),
        ("{devices=[2,2]<=[2,2]T(0,0)}", 15),
        ("{replicated", 12),
        ("{replicated} x", 14),
        ("{devices=[2]<=[2] last_tile_dims={foo}}", 35),
        ("", 1),
        ("replicated", 1),
        ("{maximal device=}", 17),
        ("{devices=[2,2]<=[2,2]T(1,0}", 27),
        ('{devices=[2,4]<=[8] metadata={op_name="x}', 39),
        ("{é}", 2),
        ("{devices=[2,4]<=[8]} é", 22),
        ("{devices = [2,4]<=[8]}", 2),
        ('{devices=[2]0,1 metadata={foo="x"}}', 27),
        ("{maximal device=9223372036854775808}", 17),
        ("{devices=[2,-4]<=[8]}", 13),
        ("{mesh['x'=2], [{'x'}]}", 2),
    ],
    ids=repr,
)
def test_malformed_text_raises_value_error_naming_the_column(text, column):
    with pytest.raises(ValueError, match=f"column {column}\\b"):
        fastpjit.parse_hlo_sharding(text, DEVICES)


@pytest.mark.subprocess
@pytest.mark.timeout(120)
def test_deep_nesting_raises_value_error_not_a_crash():
    # Run apart: the failure mode was a segfault (unbounded recursion).
    code = textwrap.dedent(
        """
        import jax, fastpjit
        deep = ("{" * 20000, "{{" * 20000 + "}}" * 20000, "{replicated metadata=" + "{" * 20000)
        for text in deep:
            try:
                fastpjit.parse_hlo_sharding(text, jax.devices())
            except ValueError as error:
                print("column" in str(error))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=100, env=os.environ
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True"] * 3


# XLA's parser aborts, divides by zero, fails an allocation or copies past its array on these.
XLA_CRASHES_ON = [
    "{device=1 devices=[2]<=[2]}",
    "{devices=[2,2]<=[4] last_tile_dims={replicated} last_tile_dim_replicate}",
    "{devices=[2]0,1 last_tile_dim_replicate last_tile_dims={replicated}}",
    "{devices=[0,2]<=[0] last_tile_dim_replicate}",
]
XLA_CANNOT_ALLOCATE = [
    "{devices=[2]0,1 last_tile_dims={manual, manual}}",
    "{devices=[2,-1]0,1}",
]


@pytest.mark.subprocess
@pytest.mark.parametrize("text", XLA_CRASHES_ON + XLA_CANNOT_ALLOCATE)
def test_text_xla_crashes_on_raises_value_error(text):
    kind, _ = xla_verdict(text)
    assert kind == "crash" or "bad_alloc" in _
    assert_refused(text)


def assert_refused(text):
    with pytest.raises(ValueError, match="column"):
        fastpjit.parse_hlo_sharding(text, DEVICES)
    with pytest.raises(ValueError, match="column") as ours:
        _core.canonical_hlo_sharding(text, None)
    return str(ours.value)


# Where the XLA of jaxlib 0.10 and the stricter one of 0.11 disagree, fastpjit reads as the
# stricter one on every line: each text, and XLA's verdict on each line.
XLA_GREW_STRICTER = [
    # An iota of 8 devices for a grid of 28 tiles: 0.10 aborts.
    ("{devices=[2,14]<=[8] last_tile_dim_replicate}", "crash"),
    # An iota of 4 devices for a grid of 8, a list of 2 devices for 1 tile (0.10 copies past
    # its array): 0.10 reads them as nonsense.
    ("{devices=[2,4]<=[2,2]T(1,0)}", "ok"),
    ("{devices=[1,1]0,0}", "ok"),
    # A list shorter than the grid: 0.10 fills it with device 0 (`01` is device 1), which may
    # repeat device 0 so that the sharding places no array.
    ("{devices=[2,4]01,2,3,4,5,6,7}", "ok"),
    ("{devices=[4,2]7,6,5,4,3,2,1}", "ok"),
    ("{devices=[2,4]1,2,3}", "ok"),
    ("{devices=[4]0,1}", "ok"),
]


@pytest.mark.subprocess
@pytest.mark.parametrize(("text", "on_0_10"), XLA_GREW_STRICTER)
def test_text_that_xla_grew_stricter_on_is_refused_on_every_line(text, on_0_10):
    assert xla_verdict(text)[0] == by_line(jax_0_10=on_0_10, jax_0_11="error")
    assert any(words in assert_refused(text) for words in DELIBERATE_REFUSALS)


# XLA reads these, on every line, to shardings that make no sense: a transpose that is no
# permutation, no tiles at all.
XLA_READS_NONSENSE = [
    "{devices=[2,2]<=[2,2]T(0,0)}",
    "{devices=[0]<=[0]}",
]


@pytest.mark.subprocess
@pytest.mark.parametrize("text", XLA_READS_NONSENSE)
def test_text_xla_reads_as_nonsense_raises_value_error(text):
    assert xla_verdict(text)[0] == "ok"
    assert any(words in assert_refused(text) for words in DELIBERATE_REFUSALS)


# Numbers XLA reads wrapped round (2**63 is -2**63) or as negative ids and sizes.
@pytest.mark.parametrize(
    "text",
    [
        "{maximal device=9223372036854775808}",
        "{maximal device=18446744073709551615}",
        "{maximal device=-1}",
        "{devices=[-2,-2]<=[4]}",
        "{devices=[2]0,1 shard_as -1}",
        "{devices=[2]<=[18446744073709551618]}",
    ],
)
def test_numbers_that_overflow_or_are_negative_raise_value_error(text):
    with pytest.raises(ValueError, match="column"):
        _core.canonical_hlo_sharding(text, None)


@pytest.mark.parametrize(
    ("text", "devices"),
    [
        ("{devices=[2,2]<=[4]}", DEVICES),
        ("{devices=[4,4]<=[16]}", DEVICES),
        ("{devices=[2,4]<=[8]}", FOUR),
        ("{devices=[2,1,4]<=[8] last_tile_dim_replicate}", FOUR),
        ("{maximal device=8}", DEVICES),
        ("{maximal device=4}", FOUR),
        ("{devices=[2,2]0,1,2,3}", DEVICES),
        ("{devices=[8]0,1,2,3,4,5,6,8}", DEVICES),
        ("{devices=[4]0,1,2,9}", FOUR),
        ("{devices=[8]0,1,2,3,4,5,6,6}", DEVICES),
        # The iota reshape lists 3 * 6148914691236517208 = 2**64 + 8 devices, not 8.
        ("{devices=[8]<=[3,6148914691236517208]T(1,0)}", DEVICES),
    ],
    ids=param_id,
)
def test_text_that_does_not_fit_the_devices_raises_value_error(text, devices):
    with pytest.raises(ValueError):
        fastpjit.parse_hlo_sharding(text, devices)


# Text that XLA's parser rejects: fastpjit's does too, naming the column.
XLA_REJECTS = [
    "{devices=[4,2]<=[2,4]}",
    "{devices=[4,2]<=[8]T(0)}",
    "{{}}",
    "{{replicated}, {}}",
    "{devices = [2,4]<=[8]}",
    "{replicatedmetadata={}}",
    "{devices=[8]0,1,2,3,4,5,6,7x}",
    '{devices=[8]<=[8] metadata={op_name="a\\qb"}}',
    "{devices=[8]<=[8] metadata={source_line=2147483648}}",
    "{devices=[8]<=[8] metadata={profile_type={4}}}",
    '{devices=[8]<=[8] metadata={op_name="a" op_name="b"}}',
    "{{{replicated}}}",
    "{replicated devices=[8]<=[8] device=0}",
    "{devices=[1]0}",
]


@pytest.mark.parametrize("text", XLA_REJECTS)
def test_text_xla_rejects_raises_value_error(text):
    with pytest.raises(Exception):  # noqa: B017 - the oracle raises jaxlib's own error type
        xc.HloSharding.from_string(text)
    with pytest.raises(ValueError, match="column"):
        fastpjit.parse_hlo_sharding(text, DEVICES)


# Text that XLA's parser takes: fastpjit reads it too, to the same sharding.
XLA_ACCEPTS = [
    ("{devices=[2,4]<=[8] shard_as 1}", (4, 4)),
    ("{devices=[2,4]<=[8] shard_like 0}", (4, 4)),
    ("{replicated shard_as 0}", (4, 4)),
    ("{devices=[2,4]<=[8] last_tile_dims={}}", (4, 4)),
    ("{devices=[2,4]<=[8] }", (4, 4)),
    ("{devices=[4,2] 0,1,2,3,4,5,6,7}", (4, 4)),
    ("{devices=[02,004]00,1,2,3,04,5,6,7}", (4, 4)),
    ("{last_tile_dim_replicate devices=[2,1,4]<=[8]}", (4, 4)),
    ("{device=3 maximal}", (4, 4)),
    ("{maximal devices=[1]5}", (4, 4)),
    ("{replicated replicated shard_like 1}", (4, 4)),
    ("{devices=[2]0,1 devices=[4]2,3,4,5,6,7}", (4, 4)),
    ("{devices=[4,2]<=[2,4] T ( 1 , 0 ) }", (4, 4)),
    ("{devices=[4,2]<=[2,4]T(1,-0)}", (4, 4)),
    ("{ /* a comment */ devices=[4,2]<=[8] // to the end of the line\n}", (4, 4)),
    ("{devices=[4,2]<=[8]shard_as 1}", (4, 4)),
    ("{devices=[2,2,2]<=[8] last_tile_dims={} last_tile_dim_replicate}", (4, 4)),
    ("{devices=[2,1,4]<=[8] last_tile_dims={replicated, replicated}}", (4,)),
    ("{devices=[2,2,2,1]<=[8] last_tile_dims={replicated, manual}}", (4, 4)),
    ('{devices=[8]<=[8] metadata={,op_name="a\\101\\"" source_line=-5 profile_type={1}}}', (8,)),
    ("{devices=[8]<=[8] metadata={{}, {op_type='x' stack_frame_id=2}} metadata= {}}", (8,)),
    # `01` is 1, as in any decimal number.
    ("{devices=[2,4]01,2,3,4,5,6,7,0}", (4, 4)),
]


@pytest.mark.parametrize(
    "text", ["{devices=[2,4]<=[8] shard_as 1}", "{devices=[4,2]<=[2,4]T(1,0) shard_like 2}"]
)
def test_gspmd_with_a_sharding_group_indexes_like_jax(text):
    # XLA prints `shard_as N` / `shard_like N` for shardings in a sharding group; they say
    # which values share a sharding and do not change the index map.
    assert_matches_jax(gspmd(text), (4, 8))


@pytest.mark.parametrize(("text", "shape"), XLA_ACCEPTS, ids=str)
def test_text_xla_accepts_parses_to_the_same_sharding(text, shape):
    assert_parses_like_xla(text, DEVICES, shape)


def test_non_string_text_raises_type_error():
    for text in (None, 3, b"{replicated}"):
        with pytest.raises(TypeError):
            fastpjit.parse_hlo_sharding(text, DEVICES)


@pytest.mark.subprocess
def test_an_empty_device_list_raises_value_error():
    # Run apart: the failure mode is a process abort (a CHECK in GSPMDSharding's constructor).
    code = textwrap.dedent(
        """
        import fastpjit
        for text in ("{replicated}", "{devices=[0]<=[0]}", "{devices=[2,0]<=[2,0]T(1,0)}"):
            try:
                fastpjit.parse_hlo_sharding(text, [])
            except ValueError:
                print("ValueError")
        """
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["ValueError"] * 3


# --- Fuzzing against XLA's parser ----------------------------------------------------------

# Text that XLA's parser takes and fastpjit's refuses on purpose, by the words of its error:
# numbers below zero or past 2**63-1 (XLA wraps them), tile dims of zero, tile grids of 2**64
# tiles or more (XLA's count overflows), device lists or iotas of another length than the tile
# grid (jaxlib 0.10's XLA fills a short list with device 0 and copies past its array for a long
# one), iota transposes that are not permutations, `device=` mixed with an iota order, and the
# named mesh form.
DELIBERATE_REFUSALS = (
    "a non-negative integer below 2**63",
    "tile dimensions of at least 1",
    "fewer than 2**64",
    "devices for the tile grid",
    "a valid iota order",
    "named mesh form",
    "either device ids or an iota order",
    "more than one device for a tiled sharding",
)

# Texts to mutate: valid ones, and ones that XLA crashes on or reads as nonsense, whose
# neighbours are likely to be such texts too.
SEED_TEXTS = (
    [text for text, _, _ in CASES]
    + UNREDUCED
    + NO_INDEX_MAP_LIKE_JAX
    + [text for text, _ in XLA_ACCEPTS]
    + XLA_CRASHES_ON
    + [text for text, _ in XLA_GREW_STRICTER]
    + XLA_READS_NONSENSE
    + [
        "{{replicated}, {maximal device=0}}",
        "{devices=[2,2,2]<=[2,2,2]T(0,2,1) last_tile_dims={unreduced, replicated}}",
    ]
)
TOKENS = [
    "{",
    "}",
    "[",
    "]",
    "(",
    ")",
    ",",
    "=",
    "<=",
    "T",
    " ",
    "0",
    "1",
    "2",
    "4",
    "8",
    "-",
    "9" * 25,
    "18446744073709551616",
    "9223372036854775808",
    "devices=",
    "device=",
    "maximal",
    "replicated",
    "manual",
    "unreduced",
    "unknown",
    "last_tile_dim_replicate",
    "last_tile_dims={",
    "metadata={",
    "op_name=",
    "source_line=",
    '"',
    "'",
    "\\",
    "\\x4",
    "é",
    "\u2028",
    "\x00",
    "\t",
    "\n",
    "/*",
    "*/",
    "//",
    "T(0)",
    "T(1,0)",
    "<=[2,4]",
    "{}",
    " shard_as 1",
    " shard_like 0",
    "3",
    "0,1,2,3",
    " last_tile_dims={replicated}",
    " last_tile_dims={unreduced, replicated}",
    " last_tile_dims={manual}",
    " device=1",
    "<=[",
    "[2,14]",
    "maximal",
    "{maximal device=1}",
]


@st.composite
def mutated_texts(draw):
    """A seed text with a few random edits: tokens inserted, characters cut, pieces spliced."""
    text = draw(st.sampled_from(SEED_TEXTS))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, min(len(text), i + 6)))
        edit = draw(st.sampled_from(["insert", "delete", "replace", "splice", "repeat", "cut"]))
        if edit == "insert":
            text = text[:i] + draw(st.sampled_from(TOKENS)) + text[i:]
        elif edit == "delete":
            text = text[:i] + text[j:]
        elif edit == "replace":
            text = text[:i] + draw(st.sampled_from(TOKENS)) + text[j:]
        elif edit == "splice":
            other = draw(st.sampled_from(SEED_TEXTS))
            k = draw(st.integers(0, len(other)))
            text = text[:i] + other[k:]
        elif edit == "repeat":
            text = text[:j] + text[i:j] + text[j:]
        else:
            text = text[:i]
    return text


def fitting_devices(canonical):
    """The first device count (8, 4, 2 or 1) over which the text shards an array, or None."""
    for n in (8, 4, 2, 1):
        try:
            _core.canonical_hlo_sharding(canonical, n)
        except ValueError:
            continue
        return n
    return None


def assert_reads_like_xla(text, devices=DEVICES):
    """Whatever the text: fastpjit's parser raises ValueError naming the column or reads it;
    what it reads, XLA reads to the same sharding, with the same index maps; what XLA crashes
    on, it refuses; and what XLA reads, it reads too, except on purpose."""
    try:
        ours = _core.canonical_hlo_sharding(text, None)
    except ValueError as error:
        ours, refusal = None, str(error)
        assert "column" in refusal
    except BaseException as error:  # a pyo3 PanicException derives from BaseException
        pytest.fail(f"{type(error).__module__}.{type(error).__name__}: {error}")
    kind, xla = xla_verdict(text)
    if ours is None:
        if kind == "ok":
            assert any(words in refusal for words in DELIBERATE_REFUSALS), (text, xla, refusal)
        return
    assert kind == "ok", (text, kind, xla, ours)
    # The canonical text is what parse_hlo_sharding hands XLA, in this process.
    assert xla_verdict(ours) == ("ok", xla), (text, ours)
    n = fitting_devices(ours)
    if n is None:
        with pytest.raises(ValueError):
            fastpjit.parse_hlo_sharding(text, devices[:8])
        return
    sharding = fastpjit.parse_hlo_sharding(text, devices[:n])
    assert str(sharding._hlo_sharding) == xla
    theirs = gspmd(xla, devices[:n])
    for shape in [(), (840,), (840, 840), (840, 840, 840)]:
        assert_same_outcome_as_jax(sharding, shape)
        try:
            theirs.devices_indices_map(shape)
        except Exception:  # noqa: BLE001, S112 - no index map to compare
            continue
        assert_matches_jax(sharding, shape)


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.timeout(600)
@given(st.text(max_size=80))
@example("{devices=[8]<=[8]}")
def test_any_text_reads_like_xla(text):
    assert_reads_like_xla(text)


@pytest.mark.subprocess
@pytest.mark.timeout(600)
@given(mutated_texts())
@example("{{replicated},{}}")
@example("{devices=[2,14]<=[8] last_tile_dim_replicate}")
# Found by this test: XLA reads a NUL byte as the end of the text, and ends a line comment at a
# carriage return.
@example("{ /*\x00 a comment */ devices=[4,2]<=[8] // to the end of the line\n}")
@example("{replicated // a\rb\n}")
@example("{devices=[9,9999999,999999999999999998]<=[8]}")
@example("{devices=[8]<=[8] metadata={profile_type={31}}}")
def test_mutated_text_reads_like_xla(text):
    assert_reads_like_xla(text)


@st.composite
def clause_orders(draw):
    """A valid tiled sharding with its clauses in any order, spaced and commented at random."""
    n = draw(st.sampled_from([8, 4, 2]))
    rank = draw(st.integers(1, 3))
    subgroup = draw(
        st.sampled_from(
            [
                "",
                "last_tile_dim_replicate",
                "last_tile_dims={replicated}",
                "last_tile_dims={unreduced}",
                "last_tile_dims={unreduced, replicated}",
            ]
        )
    )
    extra = subgroup.count(",") + 1 if subgroup else 0
    grid = draw(st.sampled_from(factorizations(n, rank + extra)))
    zeros = draw(st.sampled_from(["", "0", "00"]))
    dims = ",".join(zeros + str(d) for d in grid)
    clauses = [f"devices=[{dims}]{draw(device_orders(n))}"]
    if subgroup:
        clauses.append(subgroup)
    if draw(st.booleans()):
        clauses.append('metadata={op_name="f/g" source_line=3}')
    if draw(st.booleans()):
        clauses.append(f"shard_{draw(st.sampled_from(['as', 'like']))} {draw(st.integers(0, 9))}")
    clauses = draw(st.permutations(clauses))
    space = st.sampled_from([" ", "  ", "\n", " /* c */ ", "\t"])
    return "{" + "".join(draw(space) + c for c in clauses) + draw(space) + "}"


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.timeout(600)
@given(clause_orders())
def test_clauses_in_any_order_read_like_xla(text):
    kind, _ = xla_verdict(text)
    assert kind == "ok"
    assert_reads_like_xla(text)
