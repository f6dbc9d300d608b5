"""vLLM's block-KV layout ((N, B, Hkv, d) per K and per V) in reshape_and_cache and copy_blocks,
on both NKI APIs: written in place without a host copy, against per-token / per-block references
written from the definition (slot s = block * B + offset is ``cache[s // B, s % B]``)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nki_sim
from host.cache.block_kv import block_kv_row_index
from host.cache.cache_ops import copy_blocks, reshape_and_cache
from nki_kernels.cache.kv_cache_update import kv_cache_update_blocks

pytestmark = pytest.mark.simulation
APIS = ("legacy", "nki")
BF16 = np.dtype(ml_dtypes.bfloat16)


def vllm_layer(rng, N, B, Hkv, d, dtype=np.float32):
    """A per-layer vLLM cache (2, N, B, Hkv, d) and its unbound (key_cache, value_cache) views."""
    kv = rng.standard_normal((2, N, B, Hkv, d)).astype(dtype)
    return kv, (kv[0], kv[1])


def reference_write(kv, key, value, slots):
    out = kv.copy()
    B = kv.shape[2]
    for t, s in enumerate(np.asarray(slots).tolist()):
        if s >= 0:
            out[0, s // B, s % B] = key[t].astype(kv.dtype)
            out[1, s // B, s % B] = value[t].astype(kv.dtype)
    return out


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("T, Hkv, d, N, B, dtype", [
    (150, 4, 16, 24, 8, np.float32),         # 150 token rows: a full tile and a tail
    (20, 2, 8, 6, 4, BF16),
    (5, 9, 512, 3, 4, np.float32),           # Hkv * d * 4 > 16 KiB: (token, head) rows
], ids=["tile_and_tail", "bf16", "per_head_rows"])
def test_write_matches_reference_in_place(rng, api, T, Hkv, d, N, B, dtype):
    kv, pair = vllm_layer(rng, N, B, Hkv, d, dtype)
    key = rng.standard_normal((T, Hkv, d)).astype(np.float32)
    value = rng.standard_normal((T, Hkv, d)).astype(np.float32)
    slots = B + rng.permutation((N - 1) * B)[:T]        # block 0 (the null block) never named
    slots[[0, T // 2]] = -1
    expected = reference_write(kv, key, value, slots)
    assert reshape_and_cache(key, value, pair, slots, api=api) is pair
    assert kv.tobytes() == expected.tobytes()           # the views' buffer: no host copy
    assert kv[:, 0].tobytes() == expected[:, 0].tobytes()


@pytest.mark.parametrize("api", APIS)
def test_one_descriptor_per_token_and_half(one_core, rng, api):
    """A token's Hkv heads are one contiguous row: one descriptor of Hkv * d * itemsize bytes per
    token and per K / V (the (2, N, Hkv, B, d) layout needs Hkv); padding moves nothing."""
    T, Hkv, d, N, B = 100, 8, 16, 16, 8
    _, pair = vllm_layer(rng, N, B, Hkv, d, BF16)
    key = rng.standard_normal((T, Hkv, d)).astype(BF16)
    slots = rng.permutation(N * B)[:T]
    slots[:10] = -1
    with nki_sim.tracing() as trace:
        reshape_and_cache(key, key, pair, slots, api=api)
    ind = [e for e in trace.events if e.engine == "dma" and e.dma_kind == "indirect"]
    assert len(ind) == 2                                             # 100 rows: one tail tile
    assert sum(len(e.descriptor_bytes) for e in ind) == 2 * 90
    assert {b for e in ind for b in e.descriptor_bytes} == {Hkv * d * 2}
    assert sum(e.skipped_rows for e in ind) == 2 * 10


@pytest.mark.parametrize("api", APIS)
def test_copy_blocks_per_layer_pairs_without_a_copy(one_core, rng, api):
    """Three layers, each a (2, N, B, Hkv, d) tensor unbound into K / V views: one launch per
    layer (K and V are consecutive in its buffer), the blocks copied in the callers' buffers."""
    N, B, Hkv, d = 10, 4, 2, 8
    layers = [vllm_layer(rng, N, B, Hkv, d) for _ in range(3)]
    mapping = np.array([[1, 7], [2, 0], [5, 9]])                     # block 0 as a destination
    expected = [kv.copy() for kv, _ in layers]
    for e in expected:
        e[:, mapping[:, 1]] = e[:, mapping[:, 0]]
    with nki_sim.tracing() as trace:
        copy_blocks([pair for _, pair in layers], mapping, api=api)
    for (kv, _), e in zip(layers, expected):
        assert kv.tobytes() == e.tobytes()
    index_loads = [e for e in trace.events if e.engine == "dma" and e.dma_kind == "direct"]
    assert len(index_loads) == 3                                     # one launch per layer


@pytest.mark.parametrize("api", APIS)
def test_copy_blocks_separate_key_and_value_allocations(rng, api):
    N, B, Hkv, d = 6, 2, 1, 4
    k = rng.standard_normal((N, B, Hkv, d)).astype(np.float32)
    v = rng.standard_normal((N, B, Hkv, d)).astype(np.float32)
    ek, ev = k.copy(), v.copy()
    ek[3], ev[3] = ek[1], ev[1]
    copy_blocks([(k, v)], [[1, 3]], api=api)
    assert k.tobytes() == ek.tobytes() and v.tobytes() == ev.tobytes()


@pytest.mark.parametrize("case, exc, match", [
    ("value_shape", ValueError, r"kv_cache\[1\] \(value_cache\) must have the shape"),
    ("rank", ValueError, r"kv_cache\[0\] \(key_cache\) must have shape \(num_blocks"),
    ("fp8", NotImplementedError, "block-KV cache is not supported"),
    ("overlap", ValueError, "non-overlapping key and value caches"),
    ("scales", ValueError, "k_scale / v_scale must be None"),
    ("key_shape", ValueError, r"key must have shape \(T, 2, 8\)"),
    ("slot", ValueError, "slot_mapping"),
])
def test_write_rejects_before_writing(rng, case, exc, match):
    kv, (k, v) = vllm_layer(rng, 4, 4, 2, 8)
    key = rng.standard_normal((3, 2, 8)).astype(np.float32)
    slots = np.array([0, 5, 9])
    kw = {}
    if case == "value_shape":
        v = np.zeros((4, 4, 2, 4), np.float32)
    if case == "rank":
        k = kv[0].reshape(16, 2, 8)
    if case == "fp8":
        k = np.zeros(k.shape, ml_dtypes.float8_e4m3fn)
        v = np.zeros(v.shape, ml_dtypes.float8_e4m3fn)
    if case == "overlap":
        v = kv[0]
    if case == "scales":
        kw = dict(k_scale=1.0, v_scale=1.0)
    if case == "key_shape":
        key = key[:, :1]
    if case == "slot":
        slots = np.array([0, 5, 16])
    before = (kv.tobytes(), k.tobytes(), v.tobytes())
    with pytest.raises(exc, match=match):
        reshape_and_cache(key, key, (k, v), slots, **kw)
    assert (kv.tobytes(), k.tobytes(), v.tobytes()) == before


@pytest.mark.parametrize("api", APIS)
def test_kernel_checks_row_elems(rng, api):
    _, (k, v) = vllm_layer(rng, 4, 4, 2, 8)
    key = rng.standard_normal((3, 2, 8)).astype(np.float32)
    rows = block_kv_row_index(np.array([0, 5, 9]), num_slots=16, num_kv_heads=2, per_head=False)
    kernel = kv_cache_update_blocks.for_api(api)
    before = k.tobytes()
    with pytest.raises(ValueError, match="row_elems must be Hkv"):
        kernel(key, key, k, v, rows, row_elems=4)
    with pytest.raises(ValueError, match="row_index must be"):
        kernel(key, key, k, v, rows[:2], row_elems=16)
    assert k.tobytes() == before
    kernel(key, key, k, v, rows, row_elems=16)                       # must pass
    assert k[1, 1].tobytes() == key[1].tobytes()


def test_row_index_definition():
    s = np.array([3, -1, 0])
    assert block_kv_row_index(s, num_slots=8, num_kv_heads=2, per_head=False).ravel().tolist() \
        == [3, 8, 0]
    assert block_kv_row_index(s, num_slots=8, num_kv_heads=2, per_head=True).ravel().tolist() \
        == [6, 7, 16, 16, 0, 1]
