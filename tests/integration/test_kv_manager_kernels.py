"""KVCacheManager driving the real cache kernels: forked sequences diverge through copy-on-write
(host.copy_blocks), their tokens are written with host.reshape_and_cache at the manager's slots,
and host.paged_attention over the manager's block tables matches attention computed in float64
from each sequence's own K/V history (not read back from the cache)."""

from __future__ import annotations

import numpy as np
import pytest

from host import allocate_kv_caches, paged_attention, reshape_and_cache
from host.serving.kv_manager import KVCacheManager

pytestmark = pytest.mark.simulation


def causal_attention_f64(q, keys, values, context_len):
    """q (n, H, d) at positions context_len.. ; keys/values (context_len + n, Hkv, d) history."""
    n, H, d = q.shape
    G = H // keys.shape[1]
    out = np.zeros((n, H, d))
    for i in range(n):
        p = context_len + i
        for h in range(H):
            s = keys[:p + 1, h // G].astype(np.float64) @ q[i, h].astype(np.float64) / np.sqrt(d)
            w = np.exp(s - s.max())
            out[i, h] = (w / w.sum()) @ values[:p + 1, h // G].astype(np.float64)
    return out


def test_forked_sequences_diverge_through_copy_on_write(rng, tol):
    L, N, H, Hkv, B, d = 2, 10, 4, 2, 4, 8
    caches = allocate_kv_caches(L, N, Hkv, B, d, np.float32)
    mgr = KVCacheManager(N, B, kv_caches=caches)
    hist = {}   # seq -> per-layer (K, V) histories, float32 (T, Hkv, d)

    def append(seq, n):
        slots = mgr.append_slots(seq, n)
        new = []
        for layer in range(L):
            k = rng.uniform(-1, 1, (n, Hkv, d)).astype(np.float32)
            v = rng.uniform(-1, 1, (n, Hkv, d)).astype(np.float32)
            reshape_and_cache(k, v, caches[layer], slots)
            K, V = hist[seq][layer]
            hist[seq][layer] = (np.concatenate([K, k]), np.concatenate([V, v]))
            new.append((k, v))
        return new

    mgr.add_sequence("a")
    hist["a"] = [(np.zeros((0, Hkv, d), np.float32),) * 2 for _ in range(L)]
    append("a", 6)                                   # blocks: one full, one half full
    mgr.fork("a", "b")
    hist["b"] = list(hist["a"])
    shared_tail = int(mgr.block_table("a")[-1])
    new_b = append("b", 3)                           # copy-on-write of the half-full block
    new_a = append("a", 2)                           # a's block is its own again: in place
    assert int(mgr.block_table("a")[-1]) == shared_tail
    assert int(mgr.block_table("b")[1]) != shared_tail and mgr.refcount(shared_tail) == 1
    assert mgr.block_table("b")[0] == mgr.block_table("a")[0] and mgr.refcount(
        int(mgr.block_table("a")[0])) == 2          # the full first block stays shared

    for layer in range(L):
        for seq in ("a", "b"):                       # the cache holds each history exactly
            slots = mgr.slot_mapping(seq)
            K, V = hist[seq][layer]
            np.testing.assert_array_equal(caches[layer][0, slots // B, :, slots % B], K)
            np.testing.assert_array_equal(caches[layer][1, slots // B, :, slots % B], V)

    q = rng.uniform(-1, 1, (5, H, d)).astype(np.float32)
    layer = 1
    k = np.concatenate([new_a[layer][0], new_b[layer][0]])
    v = np.concatenate([new_a[layer][1], new_b[layer][1]])
    out = paged_attention(q, k, v, caches[layer], mgr.block_tables(["a", "b"]), [2, 3], [6, 6],
                          mixed_precision=False, large_tile_size=512)
    ref = np.concatenate([causal_attention_f64(q[:2], *hist["a"][layer], 6),
                          causal_attention_f64(q[2:], *hist["b"][layer], 6)])
    atol, rtol = tol("fp32", np.float32)
    np.testing.assert_allclose(out, ref, atol=atol, rtol=rtol)


def test_copy_on_write_of_an_mla_cache(rng):
    """The same copy-on-write on a stack of MLA latent caches (L, N, B, E)."""
    from host.cache.mla_layout import allocate_mla_cache

    caches = np.stack([allocate_mla_cache(6, 4, kv_lora_rank=8, qk_rope_head_dim=4,
                                          dtype=np.float32) for _ in range(2)])
    caches[...] = rng.uniform(-1, 1, caches.shape).astype(np.float32)
    before = caches.copy()
    mgr = KVCacheManager(6, 4, kv_caches=caches)
    mgr.add_sequence("a")
    mgr.append_slots("a", 5)
    mgr.fork("a", "b")
    mgr.append_slots("b", 1)
    old, new = int(mgr.block_table("a")[1]), int(mgr.block_table("b")[1])
    assert old != new
    np.testing.assert_array_equal(caches[:, new], before[:, old])
    untouched = [b for b in range(6) if b != new]
    np.testing.assert_array_equal(caches[:, untouched], before[:, untouched])
