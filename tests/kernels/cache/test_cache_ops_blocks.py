"""copy_blocks / swap_blocks (host.cache.cache_ops) and the kernels of nki_kernels.cache.block_copy on the simulator.

Reference: plain NumPy block assignment per layer, from the definition cache[:, dst] = cache[:, src].
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from host.cache.cache_ops import (allocate_kv_caches, block_copy_row_pairs, block_row_len, copy_blocks,
                            kv_caches_share_buffer, swap_blocks)

pytestmark = pytest.mark.simulation
APIS = ("legacy", "nki")      # tests with ``api`` run both NKI APIs (trn2)

DTYPES = [np.float32, ml_dtypes.bfloat16, np.float16]


def random_caches(rng, n_layers, shape, dtype=np.float32, shared=True):
    layers = (allocate_kv_caches(n_layers, *shape[1:], dtype=dtype) if shared
              else [np.empty(shape, dtype) for _ in range(n_layers)])
    for layer in layers:
        layer[...] = rng.standard_normal(shape).astype(dtype)
    return layers


def reference_copy(layers, mapping):
    out = [c.copy() for c in layers]
    for c in out:
        for s, d in np.asarray(mapping).reshape(-1, 2).tolist():
            c[:, d] = c[:, s].copy()
    return out


def disjoint_mapping(rng, n_blocks, n):
    ids = rng.permutation(n_blocks)[:2 * n]
    return np.stack([ids[:n], ids[n:]], axis=1)


def assert_layers_equal(actual, expected):
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert a.tobytes() == e.tobytes(), f"layer {i} differs"


# ----------------------------------------------------------------------------- copy_blocks must-pass


@pytest.mark.parametrize("shared", [True, False], ids=["one_buffer", "separate_layers"])
@pytest.mark.parametrize("n_layers", [1, 3])
@pytest.mark.parametrize("api", APIS)
def test_copy_blocks_matches_reference(rng, shared, n_layers, api):
    layers = random_caches(rng, n_layers, (2, 10, 2, 4, 8), shared=shared)
    assert kv_caches_share_buffer(layers) == (shared or n_layers == 1)
    mapping = disjoint_mapping(rng, 10, 4)
    expected = reference_copy(layers, mapping)
    copy_blocks(layers, mapping, api=api)
    assert_layers_equal(layers, expected)


def test_copy_blocks_6d_array_and_duplicate_sources(rng):
    """One (L, 2, N, Hkv, B, d) array; a source may feed several destinations."""
    whole = rng.standard_normal((2, 2, 6, 1, 2, 4)).astype(np.float32)
    mapping = np.array([[0, 3], [0, 4], [1, 5]])
    expected = np.stack(reference_copy(list(whole), mapping))
    copy_blocks(whole, mapping)
    assert whole.tobytes() == expected.tobytes()


@pytest.mark.parametrize("max_row_bytes", [4, 24, 64, 10**6])
def test_copy_blocks_split_rows(rng, max_row_bytes):
    """Slabs split into several rows (n_sub > 1), including a slab size with odd divisors."""
    layers = random_caches(rng, 2, (2, 7, 3, 2, 5))    # slab = 30 elements
    mapping = np.array([[1, 6], [2, 0]])
    expected = reference_copy(layers, mapping)
    copy_blocks(layers, mapping, max_row_bytes=max_row_bytes)
    assert_layers_equal(layers, expected)


@pytest.mark.parametrize("api", APIS)
def test_copy_blocks_many_rows_several_tiles(rng, api):
    """> 128 rows: full tiles plus a tail."""
    layers = random_caches(rng, 4, (2, 64, 2, 2, 4))
    mapping = disjoint_mapping(rng, 64, 20)              # 4 * 2 * 20 = 160 rows
    expected = reference_copy(layers, mapping)
    copy_blocks(layers, mapping, api=api)
    assert_layers_equal(layers, expected)


def test_copy_blocks_empty_mapping_is_a_no_op(rng):
    layers = random_caches(rng, 2, (2, 4, 1, 2, 4))
    before = [c.tobytes() for c in layers]
    copy_blocks(layers, np.zeros((0, 2), np.int64))
    assert [c.tobytes() for c in layers] == before


# ----------------------------------------------------------------------------- copy_blocks must-fail


@pytest.mark.parametrize("mapping,match", [
    pytest.param([[0, 2], [1, 2]], "not repeat a destination", id="duplicate_destination"),
    pytest.param([[0, 1], [1, 2]], "both source and destination", id="src_dst_overlap"),
    pytest.param([[0, 0]], "both source and destination", id="self_copy"),
    pytest.param([[0, 4]], r"block_mapping\[:, 1\] must hold destination block ids in \[0, 4\)", id="dst_too_big"),
    pytest.param([[-1, 2]], r"block_mapping\[:, 0\] must hold source block ids", id="negative_src"),
    pytest.param([[0, 1, 2]], "shape", id="not_n_by_2"),
    pytest.param([[0.0, 1.0]], "integer", id="float_ids"),
])
def test_copy_blocks_bad_mapping_rejected_untouched(rng, mapping, match):
    layers = random_caches(rng, 2, (2, 4, 1, 2, 4))
    before = [c.tobytes() for c in layers]
    with pytest.raises(ValueError, match=match):
        copy_blocks(layers, np.array(mapping))
    assert [c.tobytes() for c in layers] == before


def test_copy_blocks_mismatched_layers_rejected(rng):
    a = rng.standard_normal((2, 4, 1, 2, 4)).astype(np.float32)
    for other, match in [(np.zeros((2, 5, 1, 2, 4), np.float32), "shape"),
                         (np.zeros((2, 4, 1, 2, 4), np.float16), "dtype"),
                         (a, "distinct")]:
        before = a.tobytes()
        with pytest.raises(ValueError, match=match):
            copy_blocks([a, other], [[0, 1]])
        assert a.tobytes() == before
    with pytest.raises(ValueError, match="non-empty list"):
        copy_blocks([], [[0, 1]])


def test_share_buffer_detection_must_fail():
    """Separate allocations, reordered views, or non-consecutive views are not one buffer."""
    buf = allocate_kv_caches(3, 4, 1, 2, 4)
    assert kv_caches_share_buffer(buf)
    assert not kv_caches_share_buffer([buf[1], buf[0]])
    assert not kv_caches_share_buffer([buf[0], buf[2]])
    assert not kv_caches_share_buffer([np.zeros((2, 4, 1, 2, 4)), np.zeros((2, 4, 1, 2, 4))])


# ----------------------------------------------------------------------------- swap_blocks


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: np.dtype(t).name)
def test_swap_blocks_between_caches(rng, dtype, api):
    src = rng.standard_normal((2, 9, 2, 4, 8)).astype(dtype)     # e.g. host cache, more blocks
    dst = rng.standard_normal((2, 5, 2, 4, 8)).astype(dtype)     # device cache
    src_before = src.tobytes()
    mapping = np.array([[8, 0], [3, 4], [3, 2]])
    expected = dst.copy()
    for s, d in mapping:
        expected[:, d] = src[:, s]
    swap_blocks(src, dst, mapping, api=api)
    assert dst.tobytes() == expected.tobytes()
    assert src.tobytes() == src_before


def test_swap_blocks_same_cache_is_copy(rng):
    cache = rng.standard_normal((2, 6, 1, 2, 4)).astype(np.float32)
    expected = reference_copy([cache], [[0, 5]])[0]
    swap_blocks(cache, cache, [[0, 5]])
    assert cache.tobytes() == expected.tobytes()
    with pytest.raises(ValueError, match="both source and destination"):
        swap_blocks(cache, cache, [[1, 2], [2, 3]])


@pytest.mark.parametrize("case", ["dst_id", "src_id", "duplicate_dst", "dtype", "shape", "overlap"])
def test_swap_blocks_rejected_untouched(rng, case):
    src = rng.standard_normal((2, 4, 1, 2, 4)).astype(np.float32)
    dst = rng.standard_normal((2, 3, 1, 2, 4)).astype(np.float32)
    mapping = {"dst_id": [[0, 3]], "src_id": [[4, 0]], "duplicate_dst": [[0, 1], [2, 1]]}.get(case, [[0, 1]])
    if case == "dtype":
        src = src.astype(np.float16)
    if case == "shape":
        src = np.zeros((2, 4, 1, 4, 2), np.float32)
    if case == "overlap":
        buf = rng.standard_normal(200).astype(np.float32)        # contiguous, overlapping views
        src, dst = buf[:64].reshape(2, 4, 1, 2, 4), buf[40:88].reshape(2, 3, 1, 2, 4)
    before = dst.tobytes()
    with pytest.raises(ValueError):
        swap_blocks(src, dst, mapping)
    assert dst.tobytes() == before


@pytest.mark.parametrize("api", ["Legacy", "neuron", 2])
def test_bad_api_rejected_untouched(rng, api):
    layers = random_caches(rng, 1, (2, 4, 1, 2, 4))
    other = rng.standard_normal((2, 4, 1, 2, 4)).astype(np.float32)
    before = [c.tobytes() for c in layers + [other]]
    with pytest.raises(ValueError, match=r"api must be one of \('auto', 'legacy', 'nki'\)"):
        copy_blocks(layers, [[0, 1]], api=api)
    with pytest.raises(ValueError, match=r"api must be one of \('auto', 'legacy', 'nki'\)"):
        swap_blocks(layers[0], other, [[0, 1]], api=api)
    assert [c.tobytes() for c in layers + [other]] == before


# ----------------------------------------------------------------------------- host helpers


def test_block_row_len_is_largest_fitting_divisor():
    assert block_row_len(30, 4, 24) == 6
    assert block_row_len(30, 4, 4) == 1
    assert block_row_len(4096, 2, 16384) == 4096
    assert block_row_len(2 * 8 * 16 * 128, 2, 16384) == 8192
    assert block_row_len(7, 4, 20) == 1                      # prime slab: rows of one element


def test_row_pairs_address_the_blocks():
    """Row (l, kv, blk, j) of the (L*2*N*n_sub, F) view lies inside cache[l, kv, blk]."""
    n_layers, n_blocks, n_sub = 2, 5, 3
    pairs = block_copy_row_pairs(np.array([1, 4]), np.array([0, 2]), num_layers=n_layers,
                                 src_num_blocks=n_blocks, dst_num_blocks=n_blocks, n_sub=n_sub)
    coords = np.stack(np.unravel_index(pairs, (n_layers, 2, n_blocks, n_sub)), axis=-1)
    got = {(tuple(s[:2]), s[2], d[2], s[3], d[3]) for s, d in coords}
    want = {((l, kv), s, d, j, j) for l in range(2) for kv in range(2) for s, d in [(1, 0), (4, 2)]
            for j in range(n_sub)}
    assert got == want and len(pairs) == len(want)
    assert (coords[:, 0, :2] == coords[:, 1, :2]).all()      # same layer and kv half


# ----------------------------------------------------------------------------- property test


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_copies_match_numpy(data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1), label="seed"))
    n_layers = data.draw(st.integers(1, 4), label="L")
    n_blocks = data.draw(st.integers(2, 120), label="N")
    shape = (2, n_blocks, data.draw(st.integers(1, 3), label="Hkv"),
             data.draw(st.sampled_from([1, 2, 4, 8]), label="B"), data.draw(st.integers(1, 24), label="d"))
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    shared = data.draw(st.booleans(), label="shared")
    n = data.draw(st.integers(0, n_blocks // 2), label="n")
    max_row_bytes = data.draw(st.sampled_from([4, 8, 64, 16384]), label="max_row_bytes")
    layers = random_caches(rng, n_layers, shape, dtype=dtype, shared=shared)
    mapping = disjoint_mapping(rng, n_blocks, n)
    expected = reference_copy(layers, mapping)
    copy_blocks(layers, mapping, max_row_bytes=max_row_bytes)
    assert_layers_equal(layers, expected)


def test_cache_kernels_at_lnc2_write_what_one_core_writes(rng, monkeypatch):
    # At LNC 2 (a device's default on trn2) the cache kernels run whole on both cores: a write
    # and a copy (no row both source and destination) leave the same bytes as on one core
    import nki_sim
    from host.cache.cache_ops import reshape_and_cache
    from nki_kernels.toolchain import LNC_ENV

    layers = random_caches(rng, 2, (2, 10, 2, 4, 8))
    mapping = disjoint_mapping(rng, 10, 4)
    key = rng.standard_normal((5, 2, 8)).astype(np.float32)
    value = rng.standard_normal((5, 2, 8)).astype(np.float32)
    slots = rng.permutation(40)[:5]
    done = {}
    for lnc in ("1", "2"):
        monkeypatch.setenv(LNC_ENV, lnc)
        caches = [c.copy() for c in layers]
        with nki_sim.use_target("trn2"), nki_sim.tracing() as trace:
            reshape_and_cache(key, value, caches[0], slots, api="nki")
            copy_blocks(caches, mapping, api="nki")
        done[lnc] = caches
        assert {e.program_id[0] for e in trace.events} == ({0} if lnc == "1" else {0, 1})
    assert_layers_equal(done["2"], done["1"])
    assert_layers_equal(done["1"], reference_copy(done["1"], mapping))   # the copy is complete
