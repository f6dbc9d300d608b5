"""The attention variants of host.reference.paged_attention_ref against a brute-force float64 loop.

``brute_force`` below is written from the definitions (docs/attention-variants.md) one
(sequence, head, query) at a time, one key at a time, with no vectorization and no host code.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from host.reference import paged_attention_ref

E4M3FN, E5M2 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2


def brute_force(query, key, value, kv_cache, block_tables, query_lens, context_lens, *,
                softmax_scale=None, sliding_window=None, logits_soft_cap=None, alibi_slopes=None,
                sinks=None, k_scale=None, v_scale=None, alibi_key_only=False):
    """``alibi_key_only``: use BLOOM's bias slope_h * k instead of slope_h * (k - p)."""
    T, H, d = query.shape
    Hkv, B = key.shape[1], kv_cache.shape[3]
    group = H // Hkv
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else softmax_scale
    # scales, slopes and sinks are float32 values by definition (the API normalizes to float32)
    ks = np.ones(Hkv) if k_scale is None else np.broadcast_to(np.float32(k_scale), (Hkv,))
    vs = np.ones(Hkv) if v_scale is None else np.broadcast_to(np.float32(v_scale), (Hkv,))
    out = np.zeros((T, H, d))
    start = 0
    for i, (qn, cn) in enumerate(zip(query_lens, context_lens)):
        def kv_at(pos, g):
            """K and V of the key at absolute position pos of sequence i, KV head g."""
            if pos < cn:
                blk, off = block_tables[i][pos // B], pos % B
                return (float(ks[g]) * kv_cache[0, blk, g, off].astype(np.float64),
                        float(vs[g]) * kv_cache[1, blk, g, off].astype(np.float64))
            t = start + pos - cn
            return key[t, g].astype(np.float64), value[t, g].astype(np.float64)

        for h in range(H):
            g = h // group
            for a in range(qn):
                p = cn + a                                   # absolute query position
                q = query[start + a, h].astype(np.float64)
                logits, values = [], []
                for k in range(p + 1):                       # causal: keys 0 .. p
                    if sliding_window is not None and k < p - sliding_window + 1:
                        continue
                    kk, vv = kv_at(k, g)
                    s = scale * float(np.dot(q, kk))
                    if alibi_slopes is not None:
                        s += float(alibi_slopes[h]) * (k if alibi_key_only else k - p)
                    if logits_soft_cap is not None:
                        s = logits_soft_cap * math.tanh(s / logits_soft_cap)
                    logits.append(s)
                    values.append(vv)
                m = max(logits) if sinks is None else max(max(logits), float(sinks[h]))
                weights = [math.exp(s - m) for s in logits]
                denom = sum(weights) + (0.0 if sinks is None else math.exp(float(sinks[h]) - m))
                out[start + a, h] = sum(w * v for w, v in zip(weights, values)) / denom
        start += qn
    return out


def make_case(seed, *, query_lens=(3, 1, 5), context_lens=(7, 0, 12), H=4, Hkv=2, d=8, B=4,
              cache_dtype=np.float64, cache_amp=1.0):
    rng = np.random.default_rng(seed)
    T = sum(query_lens)
    nblk = [-(-c // B) for c in context_lens]
    N = sum(nblk) + 2
    perm = rng.permutation(N)
    bt = np.full((len(query_lens), max(nblk) + 1), -1, np.int32)
    off = 0
    for i, n in enumerate(nblk):
        bt[i, :n] = perm[off:off + n]
        off += n
    u = lambda *shape: rng.uniform(-1, 1, shape)  # noqa: E731
    cache = (u(2, N, Hkv, B, d) * cache_amp).astype(cache_dtype)
    return u(T, H, d) * 2, u(T, Hkv, d) * 2, u(T, Hkv, d), cache, bt, np.array(query_lens), np.array(context_lens)


SLOPES = np.array([0.5, 0.25, 0.125, 0.0625], np.float32)
SINKS = np.array([0.3, -1.0, 2.5, 0.0], np.float32)

OPTION_SETS = {
    "window_3": dict(sliding_window=3),
    "soft_cap": dict(logits_soft_cap=0.7),
    "alibi": dict(alibi_slopes=SLOPES),
    "sinks": dict(sinks=SINKS),
    "fp8_e4m3fn_per_tensor": dict(cache_dtype=E4M3FN, k_scale=0.05, v_scale=0.02),
    "fp8_e5m2_per_head": dict(cache_dtype=E5M2, k_scale=np.array([0.05, 0.1], np.float32),
                              v_scale=np.array([0.01, 0.03], np.float32)),
    "window_sinks_fp8": dict(sliding_window=5, sinks=SINKS, cache_dtype=E4M3FN,
                             k_scale=np.array([0.03, 0.07], np.float32), v_scale=0.02),
    "alibi_soft_cap": dict(alibi_slopes=SLOPES, logits_soft_cap=0.9),
    "alibi_sinks": dict(alibi_slopes=SLOPES, sinks=SINKS),
    "everything": dict(sliding_window=4, logits_soft_cap=1.5, alibi_slopes=SLOPES, sinks=SINKS,
                       cache_dtype=E5M2, k_scale=0.05, v_scale=np.array([0.02, 0.04], np.float32),
                       softmax_scale=0.8),
}


@pytest.mark.parametrize("name", list(OPTION_SETS))
def test_options_alone_and_combined_match_brute_force(name):
    opts = dict(OPTION_SETS[name])
    dtype = opts.pop("cache_dtype", np.float64)
    amp = 30.0 if dtype is not np.float64 else 1.0            # fp8 payloads are scaled values
    args = make_case(7, cache_dtype=dtype, cache_amp=amp)
    out = paged_attention_ref(*args, **opts)
    expected = brute_force(*args, **opts)
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-12)
    # every option set changes the result (none of these cases is a no-op)
    scales = {k: opts[k] for k in ("k_scale", "v_scale") if k in opts}
    if len(opts) > len(scales):
        assert np.max(np.abs(out - paged_attention_ref(*args, **scales))) > 1e-3


def test_sliding_window_of_one_attends_only_to_itself():
    args = make_case(1)
    query, key, value = args[:3]
    out = paged_attention_ref(*args, sliding_window=1)
    group = query.shape[1] // key.shape[1]
    np.testing.assert_allclose(out, np.repeat(value, group, axis=1), rtol=0, atol=1e-15)
    # with a sink the single key keeps weight e^s / (e^s + e^sink)
    out = paged_attention_ref(*args, sliding_window=1, sinks=SINKS)
    s = np.einsum("thd,thd->th", query, np.repeat(key, group, axis=1)) / math.sqrt(query.shape[2])
    w = 1.0 / (1.0 + np.exp(SINKS.astype(np.float64)[None, :] - s))
    np.testing.assert_allclose(out, w[..., None] * np.repeat(value, group, axis=1), rtol=1e-12, atol=1e-15)


def test_window_covering_every_key_is_a_no_op():
    args = make_case(2)
    longest = int(max(args[5] + args[6]))                   # max(query_len + context_len)
    plain = paged_attention_ref(*args)
    np.testing.assert_array_equal(paged_attention_ref(*args, sliding_window=longest), plain)
    np.testing.assert_array_equal(paged_attention_ref(*args, sliding_window=10**9), plain)
    assert np.max(np.abs(paged_attention_ref(*args, sliding_window=longest - 1) - plain)) > 1e-3


def test_very_negative_sinks_are_a_no_op():
    args = make_case(3)
    plain = paged_attention_ref(*args)
    np.testing.assert_array_equal(paged_attention_ref(*args, sinks=np.full(4, -1e30, np.float32)), plain)
    np.testing.assert_allclose(paged_attention_ref(*args, sinks=np.full(4, -60.0)), plain, rtol=0, atol=1e-20)


def test_huge_soft_cap_is_almost_a_no_op():
    args = make_case(4)
    np.testing.assert_allclose(paged_attention_ref(*args, logits_soft_cap=1e6), paged_attention_ref(*args),
                               rtol=0, atol=1e-9)


@pytest.mark.parametrize("fp8", [E4M3FN, E5M2], ids=["e4m3fn", "e5m2"])
def test_fp8_dequantization_equals_the_dequantized_float_cache(fp8):
    """fp8 cache + scales == the float64 cache k_fp8 * k_scale[kv head], v_fp8 * v_scale[kv head]."""
    args = list(make_case(5, cache_dtype=fp8, cache_amp=100.0))
    k_scale = np.array([0.01, 0.02], np.float32)
    v_scale = np.array([0.5, 0.03], np.float32)
    out = paged_attention_ref(*args, k_scale=k_scale, v_scale=v_scale)
    deq = args[3].astype(np.float64)
    deq[0] *= k_scale.astype(np.float64)[None, :, None, None]
    deq[1] *= v_scale.astype(np.float64)[None, :, None, None]
    args[3] = deq
    np.testing.assert_allclose(out, paged_attention_ref(*args), rtol=0, atol=1e-13)


def test_fp8_values_beyond_240_are_read_as_stored():
    """The reference dequantizes whatever the cache holds (an e4m3fn 448 is 448 * scale): the
    saturation at 240 is the cache WRITE's rule, not part of the attention definition."""
    args = list(make_case(6, query_lens=(1,), context_lens=(1,), H=1, Hkv=1, d=1, B=1,
                          cache_dtype=E4M3FN))
    args[3][:] = 0
    args[3][1, args[4][0, 0], 0, 0, 0] = 448.0
    args[0][:] = 0.0                                          # equal weights for the 2 keys
    out = paged_attention_ref(*args, k_scale=1.0, v_scale=0.5)
    assert out[0, 0, 0] == pytest.approx((448.0 * 0.5 + args[2][0, 0, 0]) / 2, abs=1e-12)


def test_alibi_query_offset_cancels_only_without_sinks_and_soft_cap():
    """Sources differ in the per-row offset of the ALiBi bias (BLOOM: slope*k, vLLM: slope*(k - ctx),
    FlashInfer: slope*(k - query index)). A per-row constant cancels in a plain softmax but not with
    sinks or a soft cap, where this project's slope*(k - p) is what counts."""
    args = make_case(8)
    np.testing.assert_allclose(brute_force(*args, alibi_slopes=SLOPES, alibi_key_only=True),
                               paged_attention_ref(*args, alibi_slopes=SLOPES), rtol=0, atol=1e-12)
    for extra in (dict(sinks=SINKS), dict(logits_soft_cap=0.9)):
        ours = paged_attention_ref(*args, alibi_slopes=SLOPES, **extra)
        bloom = brute_force(*args, alibi_slopes=SLOPES, alibi_key_only=True, **extra)
        assert np.max(np.abs(ours - bloom)) > 1e-3, extra


# ----------------------------------------------------------------------------- must-fail


def test_head_size_zero_is_a_value_error():
    args = list(make_case(9))
    args[0], args[1], args[2] = (np.zeros(a.shape[:2] + (0,)) for a in args[:3])
    args[3] = np.zeros(args[3].shape[:4] + (0,))
    with pytest.raises(ValueError, match=r"query must have head size d = query.shape\[2\] >= 1"):
        paged_attention_ref(*args)


@pytest.mark.parametrize("bad", [True, False, np.bool_(True)])
def test_bool_softmax_scale_is_a_value_error(bad):
    with pytest.raises(ValueError, match="softmax_scale must be a finite real number or None"):
        paged_attention_ref(*make_case(10), softmax_scale=bad)


@pytest.mark.parametrize("kwargs,match", [
    (dict(k_scale=1.0, v_scale=1.0), r"k_scale must be None for a float64 KV cache"),
    (dict(sliding_window=0), r"sliding_window must be >= 1; got 0"),
    (dict(logits_soft_cap=-1.0), r"logits_soft_cap must be a finite number > 0"),
    (dict(alibi_slopes=np.ones(3)), r"alibi_slopes must have shape \(num_heads,\) = \(4,\)"),
    (dict(sinks=np.ones(2)), r"sinks must have shape \(num_heads,\) = \(4,\)"),
])
def test_reference_validates_the_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        paged_attention_ref(*make_case(11), **kwargs)


def test_fp8_cache_without_scales_is_a_value_error():
    with pytest.raises(ValueError, match="k_scale must be given for a float8_e5m2 KV cache"):
        paged_attention_ref(*make_case(12, cache_dtype=E5M2))


def test_torch_fp8_cache_matches_numpy():
    torch = pytest.importorskip("torch")
    args = make_case(13, cache_dtype=E4M3FN, cache_amp=50.0)
    t_cache = torch.from_numpy(args[3].view(np.uint8).copy()).view(torch.float8_e4m3fn)
    t_args = [torch.from_numpy(np.ascontiguousarray(a)) for a in args[:3]]
    out = paged_attention_ref(*t_args, t_cache, *args[4:], k_scale=0.03, v_scale=0.02)
    np.testing.assert_array_equal(out.numpy(), paged_attention_ref(*args, k_scale=0.03, v_scale=0.02))
