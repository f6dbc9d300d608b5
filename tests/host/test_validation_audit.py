"""Bad input found by an adversarial sweep of the public functions, each now a ValueError (or
NotImplementedError) naming the argument before any work or write: a wrong plan object, query
lengths that do not sum to T (checked before planning, so a huge one costs nothing), a zero-size
cache, max_row_bytes, an lnc given as a string, a 4-D tensor to the torch copy_blocks op, a
block-KV pair to swap_blocks, and flash_attn_varlen_nkifunc's own layouts (before the kernel)."""

from __future__ import annotations

import numpy as np
import pytest

import host
from host.cache.cache_ops import copy_blocks, swap_blocks

pytestmark = pytest.mark.simulation
H, HKV, D, B, N = 4, 2, 16, 8, 6


def _batch(rng):
    q = rng.standard_normal((3, H, D)).astype(np.float32)
    k, v = rng.standard_normal((2, 3, HKV, D)).astype(np.float32)
    cache = rng.standard_normal((2, N, HKV, B, D)).astype(np.float32)
    bt = np.array([[0, 1], [2, -1]], np.int32)
    return q, k, v, cache, bt


def test_attention_inputs_are_named(rng):
    q, k, v, cache, bt = _batch(rng)
    args = (q, k, v, cache, bt, np.array([2, 1]), np.array([10, 3]))
    assert host.paged_attention(*args, backend="sim").shape == q.shape               # must-pass
    for lens, got in (([10 ** 7, 1], "sum 10000001"), ([2 ** 62, 2 ** 62], f"sum {2 ** 63}")):
        with pytest.raises(ValueError, match=f"query_lens must sum to query.shape\\[0\\] = 3; got {got}"):
            host.paged_attention(q, k, v, cache, bt, np.array(lens), np.array([10, 3]),
                                 backend="sim")
    for shape in ((2, 0, HKV, B, D), (2, N, HKV, 0, D)):
        with pytest.raises(ValueError, match="kv_cache must have num_blocks, Hkv, block_size and d >= 1"):
            host.paged_attention(q, k, v, np.zeros(shape, np.float32), *args[4:], backend="sim")
    for plan in (None, {}, "plan"):
        with pytest.raises(ValueError, match="plan must be an AttentionPlan"):
            host.run_paged_attention(plan, q, k, v, cache)
    with pytest.raises(ValueError, match="plan must be an MLAStepPlan"):
        host.run_mla_attention(None, q, cache)


def test_cache_op_arguments_are_named(rng):
    cache = rng.standard_normal((2, N, HKV, B, D)).astype(np.float32)
    before = cache.tobytes()
    for bad in ("x", None, 0, -5, 1.5):
        with pytest.raises(ValueError, match="max_row_bytes must be"):
            copy_blocks([cache], np.array([[0, 1]]), max_row_bytes=bad)
        with pytest.raises(ValueError, match="max_row_bytes must be"):
            swap_blocks(cache, cache.copy(), np.array([[0, 1]]), max_row_bytes=bad)
    for lnc in ("2", "1", 2.0):
        with pytest.raises(ValueError, match=f"lnc must be 1 or 2; got {lnc!r}"):
            copy_blocks([cache], np.array([[0, 1]]), lnc=lnc)
    pair = (np.zeros((N, B, HKV, D), np.float32), np.zeros((N, B, HKV, D), np.float32))
    with pytest.raises(NotImplementedError, match="swap each cache of the pair on its own"):
        swap_blocks(pair, pair, np.array([[0, 1]]))
    assert cache.tobytes() == before
    copy_blocks([cache], np.array([[0, 1]]), max_row_bytes=64, lnc=np.int64(1))       # must-pass
    assert (cache[:, 1] == cache[:, 0]).all()


def test_the_torch_copy_blocks_op_refuses_a_4d_tensor():
    torch = pytest.importorskip("torch")
    import host.serving.torch_ops  # noqa: F401  (registers the ops)

    key_cache = torch.rand(N, B, HKV, D)
    before = key_cache.clone()
    with pytest.raises(ValueError, match=r"kv_caches must be \(L, 2, N, \.\.\.\) or one layer's"):
        torch.ops.nki_pa.copy_blocks(key_cache, torch.tensor([[1, 2]]))
    assert torch.equal(key_cache, before)


def test_the_vllm_wrapper_names_its_own_arguments(rng):
    # flash_attn_varlen_nkifunc checks vLLM's layouts itself (the kernel's messages name the
    # kernel's parameters: mask, block_tables): nothing is launched for bad input
    import nki_sim

    H, Qpad, LT = 4, 128, 512
    q = rng.standard_normal((1, H, D, Qpad)).astype(np.float32)
    k = rng.standard_normal((1, HKV, D, Qpad)).astype(np.float32)
    v = rng.standard_normal((1, HKV, Qpad, D)).astype(np.float32)
    cache = rng.standard_normal((2, 200, HKV, B, D)).astype(np.float32)
    bt = np.arange(LT // B, dtype=np.int32)
    mask = np.ones((Qpad, bt.size * B + Qpad), bool)
    good = (q, k, v, cache, bt, mask)
    bad_cases = [
        ("key must have shape", dict(key=k[:, :, :, :64])),
        ("value.dtype must equal query.dtype", dict(value=v.astype(np.float16))),
        ("query must have shape", dict(query=q[:, :, :, :100])),
        ("kv_cache.dtype must equal query.dtype", dict(kv_cache=cache.astype(np.float64))),
        ("attn_mask must have shape", dict(attn_mask=mask[:, :-1])),
        ("block_table must have a multiple of", dict(block_table=bt[:-1])),
        ("LARGE_TILE_SZ must be an integer", dict(LARGE_TILE_SZ="512")),
        ("LARGE_TILE_SZ must be a multiple of block_size", dict(LARGE_TILE_SZ=100)),
    ]
    names = ("query", "key", "value", "kv_cache", "block_table", "attn_mask")
    with nki_sim.tracing() as trace:
        for message, change in bad_cases:
            kw = dict(zip(names, good), LARGE_TILE_SZ=LT, backend="sim")
            kw.update(change)
            with pytest.raises(ValueError, match=message):
                host.flash_attn_varlen_nkifunc(**kw)
    assert not trace.events
    out = host.flash_attn_varlen_nkifunc(*good, LARGE_TILE_SZ=LT, backend="sim")  # must-pass
    assert out.shape == (1, H, Qpad, D)
