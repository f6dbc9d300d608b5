"""The MLA cache layout (docs/layouts.md §12): entry size, allocation, and the entry index formula.

The kernel write and its inverse (gather_mla_entries) round trip is in
tests/kernels/cache/test_mla_cache_write.py; here the pure-NumPy parts.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from host import allocate_mla_cache, gather_mla_entries, mla_entry_size

BF16, F16, F32 = ml_dtypes.bfloat16, np.float16, np.float32


@pytest.mark.parametrize("R,P,dtype,align,want", [
    (512, 64, BF16, None, 576),
    (512, 64, BF16, 256, 640),          # vLLM #12676's padding: 1152 B -> 1280 B
    (512, 64, F16, 256, 640),
    (512, 64, F32, 256, 576),           # 2304 B is already 9 x 256 B
    (512, 64, F32, 512, 640),           # 2560 B = 5 x 512 B
    (512, 64, BF16, 64, 576),           # 1152 B = 18 x 64 B
    (512, 64, BF16, 1, 576),
    (512, 64, BF16, 3, 576),            # any positive alignment: 1152 B = 384 x 3 B
    (512, 64, BF16, 5, 580),            # 1160 B = 232 x 5 B
    (7, 2, F32, 16, 12),
])
def test_entry_size(R, P, dtype, align, want):
    E = mla_entry_size(R, P, dtype, align)
    assert E == want
    itemsize = np.dtype(dtype).itemsize
    assert E >= R + P and (align is None or (E * itemsize) % align == 0)
    if align is not None:                # smallest such E: one unit less does not fit or align
        assert all((e * itemsize) % align for e in range(R + P, E))


def test_allocate_defaults_and_zero_padding():
    cache = allocate_mla_cache(3, 16)
    assert cache.shape == (3, 16, 576) and cache.dtype == np.dtype(BF16)
    aligned = allocate_mla_cache(5, 32, entry_alignment_bytes=256, dtype=F32)
    assert aligned.shape == (5, 32, 576) and aligned.dtype == np.float32
    padded = allocate_mla_cache(2, 64, kv_lora_rank=512, qk_rope_head_dim=64, entry_alignment_bytes=256)
    assert padded.shape == (2, 64, 640) and not padded.any()
    assert padded.flags.c_contiguous and padded.flags.writeable


@pytest.mark.parametrize("kwargs,arg,exc", [
    (dict(num_blocks=0), "num_blocks", ValueError),
    (dict(block_size=0), "block_size", ValueError),
    (dict(block_size=2.0), "block_size", ValueError),
    (dict(kv_lora_rank=0), "kv_lora_rank", ValueError),
    (dict(qk_rope_head_dim=-1), "qk_rope_head_dim", ValueError),
    (dict(entry_alignment_bytes=0), "entry_alignment_bytes", ValueError),
    (dict(entry_alignment_bytes=256.0), "entry_alignment_bytes", ValueError),
    (dict(dtype=np.int16), "dtype", ValueError),
    (dict(dtype=np.float64), "dtype", ValueError),
    (dict(dtype="not a dtype"), "dtype", ValueError),
    (dict(dtype=ml_dtypes.float8_e4m3fn), "dtype", NotImplementedError),
])
def test_allocate_rejects(kwargs, arg, exc):
    args = {"num_blocks": 2, "block_size": 4, **kwargs}
    with pytest.raises(exc, match=arg):
        allocate_mla_cache(**args)


def test_entry_index_formula_by_flat_offset(rng):
    """Element e of slot s is element s * E + e of the flattened cache: [kv_c | k_pe | padding]."""
    N, B, R, P = 3, 4, 5, 2
    cache = allocate_mla_cache(N, B, kv_lora_rank=R, qk_rope_head_dim=P, dtype=F32, entry_alignment_bytes=32)
    E = cache.shape[2]
    assert E == 8
    flat = cache.reshape(-1)                 # a view: writes land in the cache
    kv_c = rng.standard_normal((N * B, R)).astype(np.float32)
    k_pe = rng.standard_normal((N * B, P)).astype(np.float32)
    for s in range(N * B):
        flat[s * E: s * E + R] = kv_c[s]
        flat[s * E + R: s * E + R + P] = k_pe[s]
    slots = rng.permutation(N * B)
    got_c, got_pe = gather_mla_entries(cache, slots, kv_lora_rank=R, qk_rope_head_dim=P)
    np.testing.assert_array_equal(got_c, kv_c[slots])
    np.testing.assert_array_equal(got_pe, k_pe[slots])
    np.testing.assert_array_equal(cache[1, 2, :R], kv_c[1 * B + 2])             # block 1, offset 2
    assert not cache[..., R + P:].any()                                          # padding untouched


@pytest.mark.parametrize("slots,arg", [([0, 12], "slots"), ([-1], "slots"), ([0.0], "slots")])
def test_gather_rejects(slots, arg):
    cache = allocate_mla_cache(3, 4, kv_lora_rank=5, qk_rope_head_dim=2, dtype=F32)
    with pytest.raises(ValueError, match=arg):
        gather_mla_entries(cache, np.array(slots), kv_lora_rank=5, qk_rope_head_dim=2)
    with pytest.raises(ValueError, match="kv_cache"):
        gather_mla_entries(cache, np.array([0]), kv_lora_rank=6, qk_rope_head_dim=2)   # E < R + P
