"""GSPMD shardings and `parse_hlo_sharding`, differential against JAX and XLA on 8 CPU devices.

The oracle for a text is `GSPMDSharding(devices, xc.HloSharding.from_string(text))`: XLA's
parser and JAX's index maps. The parser is also fuzzed: whatever the text, it raises
ValueError or returns a sharding, and never panics.
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

import fastpjit


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
    ("{devices=[8]<=[8] metadata={op_name=\"a}b\" source_file=\"x.py\" source_line=3}}",
     DEVICES, (8,)),
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

NO_INDEX_MAP_LIKE_JAX = [
    "{devices=[2,2,2]<=[8] last_tile_dims={manual}}",
    "{devices=[2,2,2]<=[8] last_tile_dims={manual, replicated}}",
    "{devices=[2,2,2]<=[8] last_tile_dims={unreduced}}",
    "{unreduced}",
]


@pytest.mark.parametrize("text", NO_INDEX_MAP_LIKE_JAX)
def test_manual_and_unreduced_raise_not_implemented_like_jax(text):
    sharding = gspmd(text)
    with pytest.raises(NotImplementedError):
        sharding.devices_indices_map((4, 4))
    for candidate in (sharding, fastpjit.parse_hlo_sharding(text, DEVICES)):
        for function in INDEX_MAP_FUNCTIONS:
            with pytest.raises(NotImplementedError):
                function(candidate, (4, 4))


# JAX fails an assertion on these, so only ours runs.
@pytest.mark.parametrize("text", ["{manual}", "{unknown}"])
def test_other_shardings_with_no_index_map_raise_not_implemented(text):
    sharding = fastpjit.parse_hlo_sharding(text, DEVICES)
    for function in INDEX_MAP_FUNCTIONS:
        with pytest.raises(NotImplementedError):
            function(sharding, (4, 4))


# A tuple sharding describes several values, and JAX aborts the process on its index maps,
# so parse_hlo_sharding refuses it up front.
@pytest.mark.parametrize("text", ["{{replicated}, {maximal device=0}}", "{{replicated}}", "{{}}"])
def test_tuple_shardings_are_not_array_shardings(text):
    with pytest.raises(ValueError, match="tuple sharding"):
        fastpjit.parse_hlo_sharding(text, DEVICES)


# --- Errors -------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "shape"), [("{devices=[4,2]<=[8]}", (8,)),
                                             ("{devices=[4,2]<=[8]}", (8, 8, 8)),
                                             ("{devices=[2,1,4]<=[8] last_tile_dim_replicate}", ()),
                                             ("{devices=[8]<=[8]}", ())])
def test_rank_mismatch_raises_sharding_rank_error(text, shape):
    # JAX fails an assertion here; ours is an IndexError and a ValueError.
    for function in INDEX_MAP_FUNCTIONS:
        with pytest.raises(fastpjit.ShardingRankError):
            function(gspmd(text), shape)


@pytest.mark.parametrize(
    ("text", "column"),
    [
        ("{garbage}", 2),
        ("{devices=[2,2}", 14),
        ("{devices=[2,2]0,1,2}", 15),
        ("{devices=[2,2]<=[2,2]T(0,0)}", 15),
        ("{replicated", 12),
        ("{replicated} x", 14),
        ("{devices=[2]<=[2] last_tile_dims={foo}}", 35),
        ("", 1),
        ("replicated", 1),
        ("{maximal device=}", 17),
        ("{devices=[2,2]<=[2,2]T(1,0}", 27),
        ("{devices=[2,4]<=[8] metadata={op_name=\"x}", 42),
        ("{é}", 2),
        ("{devices=[2,4]<=[8]} é", 22),
    ],
    ids=repr,
)
def test_malformed_text_raises_value_error_naming_the_column(text, column):
    with pytest.raises(ValueError, match=f"column {column}\\b"):
        fastpjit.parse_hlo_sharding(text, DEVICES)


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


# Text that fastpjit's parser takes but XLA's rejects must still end in a ValueError.
XLA_REJECTS = [
    "{devices=[4,2]<=[2,4]}",
    "{devices=[4,2]<=[8]T(0)}",
    "{{}}",
    "{{replicated}, {}}",
]


@pytest.mark.parametrize("text", XLA_REJECTS)
def test_text_xla_rejects_raises_value_error(text):
    with pytest.raises(Exception):  # noqa: B017 - the oracle raises jaxlib's own error type
        xc.HloSharding.from_string(text)
    with pytest.raises(ValueError):
        fastpjit.parse_hlo_sharding(text, DEVICES)


# Text that XLA's parser takes: fastpjit reads it too, to the same sharding.
XLA_ACCEPTS = [
    ("{devices=[2,4]<=[8] shard_as 1}", (4, 4)),
    ("{devices=[2,4]<=[8] shard_like 0}", (4, 4)),
    ("{replicated shard_as 0}", (4, 4)),
    ("{devices=[2,4]<=[8] last_tile_dims={}}", (4, 4)),
    ("{devices=[2,4]<=[8] }", (4, 4)),
    ("{devices=[4,2] 0,1,2,3,4,5,6,7}", (4, 4)),
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


# --- Fuzzing: ValueError or a sharding, never a panic ---------------------------------------

VALID_TEXTS = [text for text, _, _ in CASES] + NO_INDEX_MAP_LIKE_JAX + [
    "{manual}",
    "{unknown}",
    "{{replicated}, {maximal device=0}}",
    "{devices=[2,2,2]<=[2,2,2]T(0,2,1) last_tile_dims={unreduced, replicated}}",
]
TOKENS = [
    "{", "}", "[", "]", "(", ")", ",", "=", "<=", "T", " ", "0", "1", "2", "4", "8", "9" * 25,
    "18446744073709551616", "6148914691236517208", "devices=", "maximal device=", "replicated",
    "manual", "unreduced", "unknown", "last_tile_dim_replicate", "last_tile_dims={",
    "metadata={", '"', "\\", "é", "\u2028", "\x00", "\t", "T(0)", "T(1,0)", "<=[2,4]", "{}",
    " shard_as 1",
]


@st.composite
def mutated_texts(draw):
    """A valid text with a few random edits: tokens inserted, characters cut, pieces spliced."""
    text = draw(st.sampled_from(VALID_TEXTS))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, len(text)))
        edit = draw(st.sampled_from(["insert", "delete", "replace", "splice", "repeat", "cut"]))
        if edit == "insert":
            text = text[:i] + draw(st.sampled_from(TOKENS)) + text[i:]
        elif edit == "delete":
            text = text[:i] + text[j:]
        elif edit == "replace":
            text = text[:i] + draw(st.sampled_from(TOKENS)) + text[j:]
        elif edit == "splice":
            other = draw(st.sampled_from(VALID_TEXTS))
            k = draw(st.integers(0, len(other)))
            text = text[:i] + other[k:]
        elif edit == "repeat":
            text = text[:j] + text[i:j] + text[j:]
        else:
            text = text[:i]
    return text


FUZZ_DEVICES = st.sampled_from([DEVICES, FOUR, DEVICES[:2], DEVICES[3:4]])


def assert_value_error_or_sharding(text, devices):
    try:
        sharding = fastpjit.parse_hlo_sharding(text, devices)
    except ValueError:
        return
    except BaseException as error:  # a pyo3 PanicException derives from BaseException
        pytest.fail(f"{type(error).__module__}.{type(error).__name__}: {error}")
    assert isinstance(sharding, GSPMDSharding)
    try:
        theirs = xc.HloSharding.from_string(text)
    except Exception:  # noqa: BLE001 - XLA's grammar is stricter about spaces; that is allowed
        theirs = None
    if theirs is not None:
        # Not `==`: JAX's equality aborts the process on tuple shardings.
        assert str(sharding._hlo_sharding) == str(theirs)
        assert sharding._device_assignment == tuple(devices)
    for shape in [(), (8,), (8, 8), (8, 8, 8)]:
        for function in INDEX_MAP_FUNCTIONS:
            try:
                function(sharding, shape)
            except (ValueError, IndexError, NotImplementedError):
                pass
            except BaseException as error:
                pytest.fail(f"{function.__name__}: {type(error).__name__}: {error}")


@given(st.text(max_size=80), FUZZ_DEVICES)
@example("{devices=[8]<=[8]}", DEVICES)
def test_any_text_gives_value_error_or_sharding(text, devices):
    assert_value_error_or_sharding(text, devices)


@given(mutated_texts(), FUZZ_DEVICES)
# A known failure, pinned so that the test fails on every run until it is fixed rather than
# only on the runs whose random search happens to reach it.
@example("{{replicated},{}}", DEVICES)
def test_mutated_text_gives_value_error_or_sharding(text, devices):
    assert_value_error_or_sharding(text, devices)
