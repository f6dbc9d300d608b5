"""copy_blocks / swap_blocks on MLA latent caches (N, B, E), through the block-copy kernels.

host.cache.cache_ops views an MLA cache as (1, N, 1, B, E) (one K/V "half", one KV head) and runs the
unchanged coalesced kernels. Reference: whole-block NumPy assignment from the definition
(``cache[dst] = cache[src]``); a block copy moves the whole block, padding included (padding is
zero in every cache built by allocate_mla_cache, so it stays zero).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import nki_sim
from host import allocate_mla_cache, copy_blocks, swap_blocks
from host.cache.cache_ops import kv_caches_share_buffer

pytestmark = pytest.mark.simulation

BF16 = ml_dtypes.bfloat16


def filled(rng, shape, dtype=BF16):
    return rng.standard_normal(shape).astype(dtype)


def mapping(rng, n_blocks, n_copy):
    ids = rng.permutation(n_blocks)[:2 * n_copy]
    return np.stack([ids[:n_copy], ids[n_copy:]], axis=1)


@pytest.mark.parametrize("target, api", [("trn1", "legacy"), ("trn2", "nki")])
@pytest.mark.parametrize("block_size,align", [(16, 256), (32, None), (64, 256)])
def test_copy_blocks_one_mla_layer(rng, block_size, align, target, api):
    cache = allocate_mla_cache(9, block_size, entry_alignment_bytes=align)
    cache[..., :576] = filled(rng, cache[..., :576].shape)
    bm = mapping(rng, 9, 4)
    expected = cache.copy()
    expected[bm[:, 1]] = expected[bm[:, 0]]
    with nki_sim.use_target(target):
        copy_blocks([cache], bm, api=api)
    assert cache.tobytes() == expected.tobytes()
    assert not cache[..., 576:].astype(np.float32).any()


@pytest.mark.parametrize("as_list", [False, True], ids=["one_array", "list_of_views"])
def test_copy_blocks_all_layers_of_one_buffer(one_core, rng, as_list):
    """(L, N, B, E) in one buffer: one launch, zero-copy row view, every layer copied."""
    whole = filled(rng, (3, 7, 16, 640))
    bm = mapping(rng, 7, 3)
    expected = whole.copy()
    expected[:, bm[:, 1]] = expected[:, bm[:, 0]]
    layers = [whole[i] for i in range(3)]
    assert kv_caches_share_buffer([c.reshape(1, 7, 1, 16, 640) for c in layers])
    with nki_sim.tracing() as trace:
        copy_blocks(layers if as_list else whole, bm)
    assert whole.tobytes() == expected.tobytes()
    # slab = 16 * 640 bf16 = 20 KiB -> rows of 10 KiB (n_sub = 2); M = 3 layers x 3 blocks x 2 rows
    ind = [e for e in trace.events if e.engine == "dma" and e.dma_kind == "indirect"]
    assert len(ind) == 2 * math.ceil(18 / 128)
    assert sum(e.bytes for e in ind) == 2 * 3 * 3 * 16 * 640 * 2
    assert all(b == 5120 * 2 for e in ind for b in e.descriptor_bytes)


def test_copy_blocks_separate_layer_allocations(rng):
    """Layers allocated separately are stacked on the host (a copy) and written back."""
    layers = [filled(rng, (5, 4, 24), np.float32) for _ in range(2)]
    bm = np.array([[0, 3], [4, 1]])
    expected = [c.copy() for c in layers]
    for c in expected:
        c[bm[:, 1]] = c[bm[:, 0]]
    copy_blocks(layers, bm)
    for got, want in zip(layers, expected):
        assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("target, api", [("trn1", "legacy"), ("trn2", "legacy"), ("trn2", "nki")])
def test_swap_blocks_between_mla_caches(rng, target, api):
    src = allocate_mla_cache(6, 16, entry_alignment_bytes=256)
    src[..., :576] = filled(rng, src[..., :576].shape)
    dst = allocate_mla_cache(4, 16, entry_alignment_bytes=256)
    dst[..., :576] = filled(rng, dst[..., :576].shape)
    bm = np.array([[5, 0], [1, 3], [2, 2]])
    src_before = src.tobytes()
    expected = dst.copy()
    expected[bm[:, 1]] = src[bm[:, 0]]
    with nki_sim.use_target(target):
        swap_blocks(src, dst, bm, api=api)
    assert dst.tobytes() == expected.tobytes()
    assert src.tobytes() == src_before


def test_swap_blocks_same_mla_cache_is_a_copy(rng):
    cache = filled(rng, (6, 8, 20), np.float32)
    expected = cache.copy()
    expected[[4, 5]] = expected[[0, 1]]
    swap_blocks(cache, cache, np.array([[0, 4], [1, 5]]))
    assert cache.tobytes() == expected.tobytes()


def test_torch_mla_cache_copied_in_place(rng):
    torch = pytest.importorskip("torch")
    cache = torch.from_numpy(filled(rng, (4, 8, 12), np.float32))
    expected = cache.clone()
    expected[2] = expected[0]
    copy_blocks([cache], np.array([[0, 2]]))
    assert torch.equal(cache, expected)


@pytest.mark.parametrize("case,arg", [
    ("mixed_layouts", "kv_caches"),            # an MLA layer next to a (2, N, Hkv, B, d) layer
    ("entry_mismatch", "kv_caches"),           # layers with different E
    ("mla_int_dtype", "kv_caches"),
    ("block_out_of_range", "block_mapping"),
    ("src_is_dst", "block_mapping"),
    ("array_rank", "kv_caches"),               # (L, N, B) is neither layout
])
def test_copy_blocks_rejects_before_writing(rng, case, arg):
    layers = [filled(rng, (5, 4, 12), np.float32) for _ in range(2)]
    bm = np.array([[0, 3]])
    if case == "mixed_layouts":
        layers[1] = filled(rng, (2, 5, 1, 4, 12), np.float32)
    if case == "entry_mismatch":
        layers[1] = filled(rng, (5, 4, 16), np.float32)
    if case == "mla_int_dtype":
        layers[1] = np.zeros((5, 4, 12), np.int16)
    if case == "block_out_of_range":
        bm = np.array([[0, 5]])
    if case == "src_is_dst":
        bm = np.array([[0, 3], [3, 1]])
    before = [c.tobytes() for c in layers]
    with pytest.raises(ValueError, match=arg):
        if case == "array_rank":
            copy_blocks(np.zeros((2, 5, 4), np.float32), bm)
        else:
            copy_blocks(layers, bm)
    assert [c.tobytes() for c in layers] == before


@pytest.mark.parametrize("case,arg", [
    ("mla_to_paged", "dst_cache"),             # (N, B, E) source, (2, N, 1, B, E) destination
    ("entry_mismatch", "dst_cache"),
    ("dtype_mismatch", "dst_cache"),
    ("block_size_mismatch", "dst_cache"),
    ("dst_block_out_of_range", "block_mapping"),
    ("src_not_mla", "src_cache"),              # 4-D
])
def test_swap_blocks_rejects_before_writing(rng, case, arg):
    src = filled(rng, (6, 4, 12), np.float32)
    dst = filled(rng, (3, 4, 12), np.float32)
    bm = np.array([[5, 2]])
    if case == "mla_to_paged":
        dst = filled(rng, (2, 3, 1, 4, 12), np.float32)
    if case == "entry_mismatch":
        dst = filled(rng, (3, 4, 16), np.float32)
    if case == "dtype_mismatch":
        dst = dst.astype(np.float16)
    if case == "block_size_mismatch":
        dst = filled(rng, (3, 8, 12), np.float32)
    if case == "dst_block_out_of_range":
        bm = np.array([[5, 3]])
    if case == "src_not_mla":
        src = src[None]
    before = dst.tobytes()
    with pytest.raises(ValueError, match=arg):
        swap_blocks(src, dst, bm)
    assert dst.tobytes() == before
