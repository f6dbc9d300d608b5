"""host/reference.py: hand-computed cases, an independent per-token loop check, and every check."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from host.reference import paged_attention_ref


def _uniform_case():
    """Zero queries -> every visible key gets the same weight -> output = mean of visible V.

    seq0: ctx 2 (block 2 of the cache), 2 new tokens; seq1: no context, 1 new token.
    H=2 query heads share the single KV head. Blocks 0 and 1 hold 1000s so a wrong gather shows.
    """
    H, Hkv, d, B, N = 2, 1, 2, 2, 3
    cache = np.full((2, N, Hkv, B, d), 1000.0)
    cache[1, 2, 0, 0] = [1, 10]
    cache[1, 2, 0, 1] = [3, 30]
    cache[0, 2] = 0.0
    value = np.array([[[5, 50]], [[7, 70]], [[11, 110]]], dtype=np.float64)
    key = np.zeros((3, Hkv, d))
    query = np.zeros((3, H, d))
    bt = np.array([[2], [-1]], dtype=np.int32)
    return query, key, value, cache, bt, [2, 1], [2, 0]


def test_hand_computed_uniform_weights():
    out = paged_attention_ref(*_uniform_case())
    assert out.shape == (3, 2, 2) and out.dtype == np.float64
    expected = np.array([[3.0, 30.0],      # row 0: mean of ctx V [1,3] and new V [5]
                         [4.0, 40.0],      # row 1: mean of [1, 3, 5, 7]
                         [11.0, 110.0]])   # seq1 row: only its own token
    for h in range(2):
        np.testing.assert_allclose(out[:, h, :], expected, rtol=0, atol=1e-12)


def test_hand_computed_softmax_weights():
    # d=1, scale=1/sqrt(1)=1. One query q=1; context key ln 3, new key 0 -> weights 3/4, 1/4.
    cache = np.zeros((2, 1, 1, 4, 1))
    cache[0, 0, 0, 0, 0] = math.log(3.0)
    cache[1, 0, 0, 0, 0] = 4.0
    out = paged_attention_ref(np.ones((1, 1, 1)), np.zeros((1, 1, 1)), np.full((1, 1, 1), 8.0),
                              cache, np.array([[0]]), [1], [1])
    assert out[0, 0, 0] == pytest.approx(0.75 * 4 + 0.25 * 8, abs=1e-12)
    # explicit scale: 2 * ln(3)/2 = ln 3 -> the same weights
    cache[0, 0, 0, 0, 0] = math.log(3.0) / 2
    out = paged_attention_ref(np.ones((1, 1, 1)), np.zeros((1, 1, 1)), np.full((1, 1, 1), 8.0),
                              cache, np.array([[0]]), [1], [1], softmax_scale=2.0)
    assert out[0, 0, 0] == pytest.approx(5.0, abs=1e-12)


def test_hand_computed_gqa_mapping():
    # H=4, Hkv=2, one token without context: head h returns value[0, h // 2].
    value = np.array([[[1.0, 2.0], [3.0, 4.0]]])
    out = paged_attention_ref(np.zeros((1, 4, 2)), np.zeros((1, 2, 2)), value,
                              np.zeros((2, 1, 2, 4, 2)), np.zeros((1, 1), np.int32), [1], [0])
    np.testing.assert_array_equal(out[0], [[1, 2], [1, 2], [3, 4], [3, 4]])


def _loop_reference(query, key, value, cache, bt, qlens, clens, scale):
    """Per-token Python loops with math.exp: a second, differently written implementation."""
    T, H, d = query.shape
    Hkv, B = cache.shape[2], cache.shape[3]
    out = np.zeros((T, H, d))
    start = 0
    for i, (qn, cn) in enumerate(zip(qlens, clens)):
        ks, vs = [], []
        for j in range(cn):
            ks.append(cache[0, bt[i][j // B], :, j % B, :])
            vs.append(cache[1, bt[i][j // B], :, j % B, :])
        for a in range(qn):
            ks.append(key[start + a])
            vs.append(value[start + a])
        for a in range(qn):
            for h in range(H):
                g = h * Hkv // H
                s = [scale * float(np.dot(query[start + a, h].astype(float), ks[k][g].astype(float)))
                     for k in range(cn + a + 1)]
                mx = max(s)
                w = [math.exp(x - mx) for x in s]
                tot = sum(w)
                out[start + a, h] = sum(w[k] * vs[k][g].astype(float) for k in range(len(w))) / tot
        start += qn
    return out


@pytest.mark.parametrize("qlens,clens,B,H,Hkv,d", [
    pytest.param([1, 3, 2], [5, 0, 9], 4, 4, 2, 8, id="decode+prefill_blk4_gqa2"),
    pytest.param([4], [0], 1, 2, 2, 4, id="no_context_blk1_mha"),
    pytest.param([1, 1, 1], [7, 1, 16], 8, 8, 1, 3, id="decodes_blk8_mqa_odd_d"),
])
def test_matches_per_token_loop(qlens, clens, B, H, Hkv, d):
    rng = np.random.default_rng(7)
    T = sum(qlens)
    nblk = [-(-c // B) for c in clens]
    N = sum(nblk) + 3
    perm = rng.permutation(N)
    bt = np.full((len(qlens), max(max(nblk), 1) + 1), -1, dtype=np.int32)
    k = 0
    for i, n in enumerate(nblk):
        bt[i, :n] = perm[k:k + n]
        k += n
    query = rng.uniform(-1, 1, (T, H, d)).astype(np.float32)
    key = rng.uniform(-1, 1, (T, Hkv, d)).astype(np.float32)
    value = rng.uniform(-1, 1, (T, Hkv, d)).astype(np.float32)
    cache = rng.uniform(-1, 1, (2, N, Hkv, B, d)).astype(np.float32)
    out = paged_attention_ref(query, key, value, cache, bt, qlens, clens)
    ref = _loop_reference(query, key, value, cache, bt, qlens, clens, 1 / math.sqrt(d))
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)


def test_accepts_bfloat16():
    q, k, v, cache, bt, ql, cl = _uniform_case()
    bf = lambda x: x.astype(ml_dtypes.bfloat16)  # noqa: E731
    out = paged_attention_ref(bf(q), bf(k), bf(v), bf(cache), bt, ql, cl)
    assert out.dtype == np.float64 and out[2, 0, 0] == 11.0


def test_torch_in_torch_out():
    torch = pytest.importorskip("torch")
    q, k, v, cache, bt, ql, cl = _uniform_case()
    out = paged_attention_ref(*(torch.from_numpy(x) for x in (q, k, v, cache, bt)), ql, cl)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float64


def _args(**over):
    q, k, v, cache, bt, ql, cl = _uniform_case()
    a = dict(query=q, key=k, value=v, kv_cache=cache, block_tables=bt, query_lens=ql, context_lens=cl)
    a.update(over)
    return a


@pytest.mark.parametrize("over,arg,fragment", [
    (dict(query=np.zeros((3, 2, 2), np.int32)), "query", "floating dtype"),
    (dict(query=np.zeros((3, 2))), "query", "be 3-D"),
    (dict(query=np.zeros((3, 3, 2)), key=np.zeros((3, 2, 2)), value=np.zeros((3, 2, 2)),
          kv_cache=np.zeros((2, 3, 2, 2, 2))), "query", "divisible by num_kv_heads=2; got H = 3"),
    (dict(key=np.zeros((3, 2, 2))), "key", "have shape (3, 1, 2)"),
    (dict(value=np.zeros((2, 1, 2))), "value", "have shape (3, 1, 2)"),
    (dict(value=np.zeros((3, 1, 2), np.int64)), "value", "floating dtype"),
    (dict(kv_cache=np.zeros((3, 3, 1, 2, 2))), "kv_cache", "have shape (2, *, *, *, 2)"),
    (dict(kv_cache=np.zeros((2, 3, 1, 2, 4))), "kv_cache", "have shape (2, *, *, *, 2)"),
    (dict(kv_cache=np.zeros((2, 3, 1, 2))), "kv_cache", "be 5-D"),
    (dict(block_tables=np.array([[2.0], [0.0]])), "block_tables", "integer dtype"),
    (dict(block_tables=np.array([[2]])), "block_tables", "have shape (2, *)"),
    (dict(block_tables=np.array([[3], [-1]])), "block_tables", "block ids (inside kv_cache) in [0, 3)"),
    (dict(block_tables=np.array([[-1], [-1]])), "block_tables", "got block_tables[0, 0] = -1"),
    (dict(block_tables=np.zeros((2, 1), np.int32), context_lens=[3, 0]), "block_tables",
     ">= ceil(context_lens[0] / 2) = 2 columns"),
    (dict(query_lens=[1, 1]), "query_lens", "sum to query.shape[0] = 3; got sum 2"),
    (dict(query_lens=[3, 0]), "query_lens", "be >= 1 everywhere"),
    (dict(context_lens=[2, -1]), "context_lens", "be >= 0 everywhere"),
    (dict(context_lens=[2]), "context_lens", "have 2 entries"),
    (dict(softmax_scale=float("nan")), "softmax_scale", "finite real number"),
    (dict(softmax_scale="0.5"), "softmax_scale", "finite real number"),
])
def test_rejects_bad_input(over, arg, fragment):
    a = _args(**over)
    scale = a.pop("softmax_scale", None)
    with pytest.raises(ValueError, match=f"^{arg} must ") as ei:
        paged_attention_ref(*a.values(), softmax_scale=scale)
    assert fragment in str(ei.value)
