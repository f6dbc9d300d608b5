"""host.mla_paged_attention_ref against a brute-force loop written here from the definition.

The brute force walks every (token, head, visible position) with scalar float64 arithmetic and
looks cache entries up by flat offset (slot * E + element of the flattened cache), so it shares
neither code nor indexing with the reference. Batches mix prefill chunks and decodes; the new
tokens are in the cache and counted in context_lens (the MLA convention).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from host import mla_paged_attention_ref


def brute_force(q, kv_cache, block_tables, query_lens, context_lens, R, P, scale):
    """out[t, h, :] by explicit loops; entries read from the flattened cache by flat offset."""
    N, B, E = kv_cache.shape
    flat = kv_cache.reshape(-1).astype(np.float64)
    T, H, _ = q.shape
    out = np.zeros((T, H, R))
    t = 0
    for i, (n, c) in enumerate(zip(query_lens, context_lens)):
        for a in range(n):
            me = c - n + a                                     # this token's position
            for h in range(H):
                qv = q[t, h].astype(np.float64)
                scores, rows = [], []
                for j in range(me + 1):                        # causal: positions 0 .. me
                    slot = int(block_tables[i][j // B]) * B + j % B
                    row = flat[slot * E: slot * E + E]
                    scores.append(scale * math.fsum(qv[e] * row[e] for e in range(R + P)))
                    rows.append(row[:R])
                m = max(scores)
                w = [math.exp(s - m) for s in scores]
                z = math.fsum(w)
                for e in range(R):
                    out[t, h, e] = math.fsum(wk * r[e] for wk, r in zip(w, rows)) / z
            t += 1
    return out


def make_mla_batch(rng, query_lens, context_lens, *, H, R, P, B, E, dtype=np.float32, spare=2):
    """Random q and cache (padding and unused blocks NaN), blocks a random permutation."""
    nblk = [-(-c // B) for c in context_lens]
    N = sum(nblk) + spare
    perm = rng.permutation(N)
    bt = np.full((len(query_lens), max(nblk) + 1), -1, np.int64)
    off = 0
    for i, n in enumerate(nblk):
        bt[i, :n] = perm[off:off + n]
        off += n
    cache = np.full((N, B, E), np.nan, np.float32)
    cache[..., :R + P] = rng.uniform(-1, 1, (N, B, R + P))
    for blk in perm[off:]:
        cache[blk] = np.nan                                    # unused blocks are never read
    for i, (n, c) in enumerate(zip(nblk, context_lens)):      # slots past the context: never read
        last = bt[i, n - 1]
        cache[last, c - (n - 1) * B:, :] = np.nan
    q = rng.uniform(-1, 1, (sum(query_lens), H, R + P)).astype(np.float32)
    return q.astype(dtype), cache.astype(dtype), bt


@pytest.mark.parametrize("query_lens,context_lens,H,R,P,B,E", [
    pytest.param([1, 1, 1], [5, 17, 1], 3, 8, 4, 4, 12, id="decodes"),
    pytest.param([6], [6], 2, 8, 4, 4, 16, id="prefill_only_no_earlier_context"),
    pytest.param([4, 1, 3, 1], [9, 13, 3, 8], 2, 6, 2, 8, 8, id="mixed_prefill_decode"),
    pytest.param([2, 1], [33, 20], 4, 16, 8, 16, 32, id="padded_entries_B16"),
])
def test_reference_matches_brute_force(rng, query_lens, context_lens, H, R, P, B, E):
    q, cache, bt = make_mla_batch(rng, query_lens, context_lens, H=H, R=R, P=P, B=B, E=E)
    ref = mla_paged_attention_ref(q, cache, bt, query_lens, context_lens, kv_lora_rank=R,
                                  qk_rope_head_dim=P)
    want = brute_force(q, cache, bt, query_lens, context_lens, R, P, 1.0 / math.sqrt(R + P))
    assert ref.shape == (sum(query_lens), H, R) and ref.dtype == np.float64
    assert np.isfinite(ref).all()                              # NaN padding / unused slots unread
    np.testing.assert_allclose(ref, want, rtol=1e-12, atol=1e-13)


def test_deepseek_dims_bf16_and_explicit_scale(rng):
    """R = 512, P = 64, 640-element bf16 entries, a DeepSeek-style scale (1/sqrt(192))."""
    qlens, clens = [3, 1], [7, 5]
    q, cache, bt = make_mla_batch(rng, qlens, clens, H=2, R=512, P=64, B=4, E=640,
                                  dtype=ml_dtypes.bfloat16)
    scale = 1.0 / math.sqrt(128 + 64)
    ref = mla_paged_attention_ref(q, cache, bt, qlens, clens, softmax_scale=scale)
    want = brute_force(q, cache, bt, qlens, clens, 512, 64, scale)
    np.testing.assert_allclose(ref, want, rtol=1e-11, atol=1e-12)
    default = mla_paged_attention_ref(q, cache, bt, qlens, clens)      # 1/sqrt(576)
    np.testing.assert_allclose(default, brute_force(q, cache, bt, qlens, clens, 512, 64, 1 / 24.0),
                               rtol=1e-11, atol=1e-12)
    assert np.abs(default - ref).max() > 1e-3                  # the scale really matters


def test_convention_decode_token_sees_itself_and_whole_context(rng):
    """A decode token at the last position with one cached token before it: out is the softmax mix
    of exactly those two entries (context_lens = 2 includes the new token)."""
    R, P = 4, 2
    cache = np.zeros((1, 4, R + P))
    cache[0, 0] = [1, 0, 0, 0, 1, 0]
    cache[0, 1] = [0, 2, 0, 0, 0, 1]
    cache[0, 2:] = np.nan                                      # positions >= 2: not this sequence
    q = np.array([[[0.5, 0.5, 0, 0, 1, 1]]])
    out = mla_paged_attention_ref(q, cache, np.array([[0]]), [1], [2], kv_lora_rank=R,
                                  qk_rope_head_dim=P, softmax_scale=1.0)
    s = np.array([0.5 + 1, 1.0 + 1])                           # q . [kv_c | k_pe]
    w = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
    np.testing.assert_allclose(out[0, 0], w[0] * cache[0, 0, :R] + w[1] * cache[0, 1, :R])


def test_prefill_first_token_sees_only_earlier_positions(rng):
    """Causality: token a of a chunk ignores later chunk tokens (changing them leaves it alone)."""
    q, cache, bt = make_mla_batch(rng, [4], [10], H=2, R=6, P=2, B=4, E=8)
    a = mla_paged_attention_ref(q, cache, bt, [4], [10], kv_lora_rank=6, qk_rope_head_dim=2)
    later = cache.copy()
    blk = bt[0, 9 // 4]
    later[blk, 9 % 4, :8] += 5.0                               # position 9 = the chunk's last token
    b = mla_paged_attention_ref(q, later, bt, [4], [10], kv_lora_rank=6, qk_rope_head_dim=2)
    np.testing.assert_array_equal(a[:3], b[:3])
    assert np.abs(a[3] - b[3]).max() > 1e-3


def test_torch_in_torch_out(rng):
    torch = pytest.importorskip("torch")
    q, cache, bt = make_mla_batch(rng, [2, 1], [5, 3], H=2, R=4, P=2, B=4, E=6)
    want = mla_paged_attention_ref(q, cache, bt, [2, 1], [5, 3], kv_lora_rank=4, qk_rope_head_dim=2)
    got = mla_paged_attention_ref(torch.from_numpy(q), torch.from_numpy(cache), torch.from_numpy(bt),
                                  [2, 1], [5, 3], kv_lora_rank=4, qk_rope_head_dim=2)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float64
    np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.parametrize("change,arg", [
    (dict(context_lens=[3, 3]), "context_lens"),               # < query_lens (new tokens not counted)
    (dict(query_lens=[4, 2]), "query_lens"),                   # sum != T
    (dict(q_width=7), "q"),                                    # != R + P
    (dict(entry=5), "kv_cache"),                               # E < R + P
    (dict(bad_block=99), "block_tables"),                      # id >= N
    (dict(narrow_table=True), "block_tables"),                 # too few columns
    (dict(softmax_scale=float("nan")), "softmax_scale"),
])
def test_reference_rejects_bad_arguments(rng, change, arg):
    qlens, clens, R, P = [4, 1], [6, 3], 4, 2
    q, cache, bt = make_mla_batch(rng, qlens, clens, H=2, R=R, P=P, B=4, E=6)
    qlens, clens = change.get("query_lens", qlens), change.get("context_lens", clens)
    if "q_width" in change:
        q = np.zeros((5, 2, change["q_width"]))
    if "entry" in change:
        cache = cache[..., :change["entry"]]
    if "bad_block" in change:
        bt[1, 0] = change["bad_block"]
    if "narrow_table" in change:
        bt = bt[:, :1]
    with pytest.raises(ValueError, match=arg):
        mla_paged_attention_ref(q, cache, bt, qlens, clens, kv_lora_rank=R, qk_rope_head_dim=P,
                                softmax_scale=change.get("softmax_scale"))
