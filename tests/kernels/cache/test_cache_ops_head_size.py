"""Head sizes above 128 (up to 512) in the cache ops: reshape_and_cache (plain and fp8),
copy_blocks and swap_blocks on the simulator, against per-definition NumPy references.

Nothing in the cache kernels tiles the head dimension: a (token, head) row of d elements is one
partition's free-axis run (d * itemsize <= 16 KiB, i.e. d <= 4096 in fp32), and block copies move
(Hkv * B * d)-element slabs split into rows that never depend on d alone. These tests pin that
down for the head sizes models use above 128 (Gemma 256, GLM / MLA-style 320 or 576-ish, 512).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from host.cache.cache_ops import allocate_kv_caches, copy_blocks, reshape_and_cache, swap_blocks

pytestmark = pytest.mark.simulation

HEAD_SIZES = [160, 192, 256, 320, 512]


def _slots(rng, n_tok, n_slots, n_negative):
    slots = rng.permutation(n_slots)[:n_tok].astype(np.int64)
    slots[:n_negative] = -1
    return slots


@pytest.mark.parametrize("d", HEAD_SIZES)
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=["fp32", "bf16"])
def test_reshape_and_cache_large_head_size(rng, d, dtype):
    n_tok, n_heads, n_blocks, block_size = 45, 3, 12, 4          # 135 rows: a tile and a tail
    cache = rng.standard_normal((2, n_blocks, n_heads, block_size, d)).astype(dtype)
    key = rng.standard_normal((n_tok, n_heads, d)).astype(np.float32)
    value = rng.standard_normal((n_tok, n_heads, d)).astype(np.float32)
    slots = _slots(rng, n_tok, n_blocks * block_size, 4)
    expected = cache.copy()
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            expected[0, s // block_size, :, s % block_size] = key[t].astype(dtype)
            expected[1, s // block_size, :, s % block_size] = value[t].astype(dtype)
    reshape_and_cache(key, value, cache, slots)
    assert cache.tobytes() == expected.tobytes()


@pytest.mark.parametrize("d", HEAD_SIZES)
def test_reshape_and_cache_fp8_large_head_size(rng, d):
    fp8 = np.dtype(ml_dtypes.float8_e4m3fn)
    n_tok, n_heads, n_blocks, block_size = 45, 3, 12, 4
    cache = np.zeros((2, n_blocks, n_heads, block_size, d), fp8)
    key = (rng.standard_normal((n_tok, n_heads, d)) * 50).astype(ml_dtypes.bfloat16)
    scale = np.array([0.1, 0.2, 0.4], np.float32)
    slots = _slots(rng, n_tok, n_blocks * block_size, 4)
    expected = cache.copy()
    inv = np.float32(1) / scale
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            q = np.clip(key[t].astype(np.float32) * inv[:, None], -240, 240).astype(fp8)
            expected[0, s // block_size, :, s % block_size] = q
            expected[1, s // block_size, :, s % block_size] = q
    reshape_and_cache(key, key, cache, slots, k_scale=scale, v_scale=scale)
    assert cache.tobytes() == expected.tobytes()


@pytest.mark.parametrize("d", HEAD_SIZES)
def test_copy_and_swap_blocks_large_head_size(rng, d):
    n_layers, n_blocks, n_heads, block_size = 2, 6, 2, 4
    caches = allocate_kv_caches(n_layers, n_blocks, n_heads, block_size, d, dtype=ml_dtypes.bfloat16)
    for c in caches:
        c[...] = rng.standard_normal(c.shape).astype(c.dtype)
    expected = [c.copy() for c in caches]
    mapping = np.array([[0, 3], [5, 1]])
    for e in expected:
        e[:, mapping[:, 1]] = e[:, mapping[:, 0]]
    copy_blocks(caches, mapping)
    for c, e in zip(caches, expected):
        assert c.tobytes() == e.tobytes()

    src = rng.standard_normal((2, 3, n_heads, block_size, d)).astype(ml_dtypes.bfloat16)
    dst = caches[1]
    want = dst.copy()
    want[:, [4, 0]] = src[:, [2, 1]]
    swap_blocks(src, dst, np.array([[2, 4], [1, 0]]))
    assert dst.tobytes() == want.tobytes()
