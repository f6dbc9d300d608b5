"""host.paged_attention / host.reshape_and_cache called from worker threads (as serving code
does): results bit-identical to the same calls made one after another, and within tolerance of
the float64 reference."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import ml_dtypes
import numpy as np
import pytest

import nki_sim
from host.attention import paged_attention
from host.cache.cache_ops import reshape_and_cache

pytestmark = pytest.mark.simulation



CASES = [  # (seed, query_lens, context_lens, H, Hkv, d, block_size, dtype, target, kernel)
    (11, [5, 1], [40, 130], 4, 2, 32, 16, np.float32, "trn2", "scheduled"),
    (12, [1, 1, 1], [17, 64, 200], 4, 1, 16, 8, ml_dtypes.bfloat16, "trn1", "dense"),
    (13, [9], [0], 2, 2, 8, 16, np.float16, "trn2", "dense"),
    (14, [3, 2], [100, 33], 6, 3, 24, 32, ml_dtypes.bfloat16, "trn1", "scheduled"),
    # mixed batches (a 40-token chunk beside decodes): one pair launch of both classes
    (15, [40, 1, 1], [60, 130, 20], 4, 2, 32, 16, np.float32, "trn2", "scheduled"),
    (16, [1, 40, 1], [90, 30, 0], 4, 2, 16, 8, ml_dtypes.bfloat16, "trn1", "scheduled"),
]


def _call(batch_factory, case):
    seed, qlens, clens, H, Hkv, d, B, dtype, target, kernel = case
    batch = batch_factory(seed, qlens, clens, H=H, Hkv=Hkv, d=d, block_size=B, dtype=dtype)
    with nki_sim.use_target(target):
        out = paged_attention(*batch.args(), large_tile_size=512, backend="sim", kernel=kernel)
    return batch, out


def test_paged_attention_from_a_thread_pool_is_bit_identical(batch_factory, tol, fast_switching):
    from host.reference import paged_attention_ref

    sequential = [_call(batch_factory, c)[1] for c in CASES]
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = [pool.submit(_call, batch_factory, c) for c in CASES for _ in range(2)]
        results = [f.result(timeout=300) for f in futures]
    for i, (batch, out) in enumerate(results):
        want = sequential[i // 2]
        assert out.dtype == want.dtype and out.tobytes() == want.tobytes(), f"case {i // 2}"
        atol, rtol = tol("mixed", batch.query.dtype)
        ref = paged_attention_ref(*batch.args())
        assert np.all(np.abs(out.astype(np.float64) - ref) <= atol + rtol * np.abs(ref)), f"case {i // 2}"


def test_reshape_and_cache_from_a_thread_pool_writes_each_cache(fast_switching):
    def job(seed):
        rng = np.random.default_rng(seed)
        cache = rng.standard_normal((2, 8, 2, 4, 16)).astype(np.float32)
        key = rng.standard_normal((6, 2, 16)).astype(np.float32)
        value = rng.standard_normal((6, 2, 16)).astype(np.float32)
        slots = rng.permutation(32)[:6]
        expect = cache.copy()
        for t, s in enumerate(slots.tolist()):        # the definition, per token
            expect[0, s // 4, :, s % 4, :] = key[t]
            expect[1, s // 4, :, s % 4, :] = value[t]
        reshape_and_cache(key, value, cache, slots)
        return cache, expect

    with ThreadPoolExecutor(max_workers=4) as pool:
        for cache, expect in pool.map(job, range(8)):
            assert cache.tobytes() == expect.tobytes()
