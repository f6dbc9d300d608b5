"""The constructs AWS's public legacy kernels rely on, run at default settings (fidelity):
block dimensions follow the simulated SDK, on-chip views stay 2-D, affine_select may read
PSUM, and a shared_hbm output may be created under an ``if`` on a trace-time constant.
Kernels: tests/sim/kernels/aws_pattern_kernels.py; references are float64 from the definition.
"""

from __future__ import annotations

import numpy as np
import pytest

import neuronxcc.nki as nki
import neuronxcc.nki.language as nl

import nki_sim

pytestmark = [pytest.mark.simulation,
              pytest.mark.filterwarnings("ignore:.*block dimension")]   # deprecated in SDK 2.23-2.24


# ------------------------------------------------------------------------------ references
def _attention_ref(q, k, v, *, causal):
    """q (b, h, d, sq), k (b, h, d, sk), v (b, h, sk, d) -> o (b, h, sq, d), lse (b, h, sq)."""
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    s = np.einsum("bhdq,bhdk->bhqk", q64, k64) / np.sqrt(q.shape[2])
    if causal:
        s = np.where(np.arange(k.shape[3])[None, :] <= np.arange(q.shape[3])[:, None], s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - m)
    lse = (m + np.log(e.sum(axis=-1, keepdims=True)))[..., 0]
    return np.einsum("bhqk,bhkd->bhqd", e / e.sum(axis=-1, keepdims=True), v64), lse


def _flash_inputs(rng, b=1, h=2, d=32, sq=256, sk=512):
    q = rng.uniform(-1, 1, (b, h, d, sq)).astype(np.float32)
    k = rng.uniform(-1, 1, (b, h, d, sk)).astype(np.float32)
    v = rng.uniform(-1, 1, (b, h, sk, d)).astype(np.float32)
    return q, k, v


def _paged_inputs(rng, *, n_heads=4, n_kv=2, d=32, bs=2, n_blocks=300, n_tiles=2, sq=128):
    kv_cache = rng.uniform(-1, 1, (2, n_blocks, n_kv, bs, d)).astype(np.float32)
    block_table = rng.permutation(n_blocks)[:n_tiles * 128].astype(np.int32)
    query = rng.uniform(-1, 1, (1, n_heads, d, sq)).astype(np.float32)
    ctx = n_tiles * 128 * bs
    mask = (rng.random((sq, ctx)) < 0.6).astype(np.uint8)
    mask[:, ::128 * bs] = 1                   # every row attends to >= 1 token of every tile
    return query, kv_cache, block_table, mask


def _paged_ref(query, kv_cache, block_table, mask):
    """Context attention in the kernel's token order (tile t, slot s, block b)."""
    _, n_heads, d, sq = query.shape
    _, _, n_kv, bs, _ = kv_cache.shape
    blocks = block_table.reshape(-1, 128)                               # (n_tiles, 128)
    # token (t, s, b) -> cache[:, blocks[t, b], head, s]
    kv = kv_cache[:, blocks].transpose(0, 3, 1, 4, 2, 5)                # (2, Hkv, t, s, 128, d)
    kv = kv.reshape(2, n_kv, -1, d).astype(np.float64)
    o = np.empty((1, n_heads, sq, d))
    m_out, l_out = np.empty((1, n_heads, sq)), np.empty((1, n_heads, sq))
    for h in range(n_heads):
        kh, vh = kv[0, h // (n_heads // n_kv)], kv[1, h // (n_heads // n_kv)]
        s = query[0, h].astype(np.float64).T @ kh.T / np.sqrt(d)
        s = np.where(mask.astype(bool), s, -np.inf)
        m = s.max(axis=1, keepdims=True)
        e = np.exp(s - m)
        o[0, h] = (e / e.sum(axis=1, keepdims=True)) @ vh
        m_out[0, h], l_out[0, h] = m[:, 0], (m + np.log(e.sum(axis=1, keepdims=True)))[:, 0]
    return o, m_out, l_out


# ----------------------------------------------------- must-pass: the AWS constructs at default
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("with_lse", [False, True], ids=["inference", "training"])
def test_flash_fwd_pattern_matches_reference(rng, tol, aws_patterns, causal, with_lse):
    # block-dim accumulators, lse_acc[:, i] read as [:, 0] in a helper, affine_select on the
    # PSUM scores (causal), the lse output created under `if with_lse:`
    q, k, v = _flash_inputs(rng)
    res = nki.simulate_kernel(aws_patterns.flash_fwd_pattern[1, 2], q, k, v, causal=causal,
                              with_lse=with_lse)
    o_ref, lse_ref = _attention_ref(q, k, v, causal=causal)
    atol, rtol = tol("fp32", np.float32)
    o = res[0] if with_lse else res
    np.testing.assert_allclose(o, o_ref, atol=atol, rtol=rtol)
    if with_lse:                    # lse[b, h, r, i] = row i * 128 + r
        lse = res[1].transpose(0, 1, 3, 2).reshape(lse_ref.shape)
        np.testing.assert_allclose(lse, lse_ref, atol=atol, rtol=rtol)


def test_masked_scores_pattern_reads_psum_in_affine_select(rng, tol, aws_patterns):
    q_t = rng.uniform(-1, 1, (32, 256)).astype(np.float32)
    k_t = rng.uniform(-1, 1, (32, 384)).astype(np.float32)
    out = nki.simulate_kernel(aws_patterns.masked_scores_pattern, q_t, k_t)
    ref = q_t.astype(np.float64).T @ k_t.astype(np.float64)
    keep = np.arange(384)[None, :] <= np.arange(256)[:, None]
    atol, rtol = tol("fp32", np.float32)
    np.testing.assert_allclose(out, np.where(keep, ref, -9984.0), atol=atol, rtol=rtol)


@pytest.mark.parametrize("return_stats", [False, True], ids=["output", "debug_stats"])
def test_paged_attention_pattern_matches_reference(rng, tol, aws_patterns, return_stats):
    # fused kv_cache gather through a transposed block-dim block table, [i, g] accumulator
    # views read as [:, 0], debug outputs created under `if return_stats:`
    query, kv_cache, block_table, mask = _paged_inputs(rng)
    res = nki.simulate_kernel(aws_patterns.paged_attention_pattern[1, 2], query, kv_cache,
                              block_table, mask, return_stats=return_stats)
    o_ref, m_ref, l_ref = _paged_ref(query, kv_cache, block_table, mask)
    atol, rtol = tol("fp32", np.float32)
    np.testing.assert_allclose(res[0] if return_stats else res, o_ref, atol=atol, rtol=rtol)
    if return_stats:
        np.testing.assert_allclose(res[1], m_ref, atol=atol, rtol=rtol)
        np.testing.assert_allclose(res[2], l_ref, atol=atol, rtol=rtol)


# -------------------------------------------------------------- 1. block dimensions by SDK
@pytest.mark.parametrize("sdk, expect", [("2.22", None), ("2.23", "warn"), ("2.24", "warn"),
                                         ("2.25", "warn"), ("2.26", "warn"), ("2.27", "warn")])
def test_block_dimensions_follow_the_simulated_sdk(rng, aws_patterns, sim_only, sdk, expect):
    import warnings

    from nki_sim import errors as E
    q, k, v = _flash_inputs(rng, h=1, sq=128, sk=256)
    kernel = aws_patterns.flash_fwd_pattern[1, 1]
    with nki_sim.configure(sdk=sdk), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        if expect == "error":
            with pytest.raises(E.BlockDimensionError, match="err_leading_dimension_of_tensor_must_be_partition"):
                nki.simulate_kernel(kernel, q, k, v, causal=False, with_lse=False)
        else:
            nki.simulate_kernel(kernel, q, k, v, causal=False, with_lse=False)
    dims_warnings = [w for w in seen if issubclass(w.category, E.BlockDimensionWarning)]
    assert bool(dims_warnings) == (expect == "warn")


def test_block_dimension_rule_can_be_overridden(rng, tol, aws_patterns, sim_only):
    from nki_sim import errors as E
    q, k, v = _flash_inputs(rng, h=1, sq=128, sk=256)
    kernel = aws_patterns.flash_fwd_pattern[1, 1]
    with nki_sim.configure(sdk="2.26", block_dims="allow"):
        o = nki.simulate_kernel(kernel, q, k, v, causal=False, with_lse=False)
    atol, rtol = tol("fp32", np.float32)
    np.testing.assert_allclose(o, _attention_ref(q, k, v, causal=False)[0], atol=atol, rtol=rtol)
    with nki_sim.configure(sdk="2.24", block_dims="error"), pytest.raises(E.BlockDimensionError):
        nki.simulate_kernel(kernel, q, k, v, causal=False, with_lse=False)


# ----------------------------------------------------------- 2. on-chip views stay 2-D
@nki.jit
def column_view_k(x, *, col, inner):
    """Doubles column `col` of a (128, n) tile through the view buf[:, col], read as [:, inner]."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    buf = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    buf[...] = nl.load(x)
    view = buf[:, col]
    view[:, inner] = nl.multiply(view[:, inner], 2.0)
    nl.store(out, value=buf)
    return out


def test_int_free_index_keeps_a_size_one_axis(rng):
    x = rng.standard_normal((128, 6)).astype(np.float32)
    out = nki.simulate_kernel(column_view_k, x, col=4, inner=0)
    ref = x.copy()
    ref[:, 4] *= 2.0
    np.testing.assert_array_equal(out, ref)


def test_kept_axis_has_size_one(rng, rejects):
    x = rng.standard_normal((128, 6)).astype(np.float32)
    with rejects(IndexError, match="(?i)out-of-bound|out of bound"):
        nki.simulate_kernel(column_view_k, x, col=4, inner=1)


# ------------------------------------------------ 3. affine_select on PSUM: cost and trace
def test_affine_select_on_psum_is_staged_and_charged(rng, aws_patterns, sim_only):
    from nki_sim import cost
    q_t = rng.uniform(-1, 1, (32, 128)).astype(np.float32)
    k_t = rng.uniform(-1, 1, (32, 512)).astype(np.float32)
    with nki_sim.tracing() as trace:
        nki.simulate_kernel(aws_patterns.masked_scores_pattern, q_t, k_t)
    sel = [e for e in trace.events if e.op == "affine_select"]
    staged = [e for e in trace.events if e.attr("staging_for") == "affine_select"]
    assert [e.engine for e in sel] == ["gpsimd"]
    assert [(e.engine, e.op, e.src_buffer, e.dst_buffer) for e in staged] == [("vector", "copy", "psum", "sbuf")]
    hw = cost.TRN2
    assert cost.formula_cycles(sel[0], hw) == hw.gpsimd_start_cycles + 512        # GPSIMD_START + N
    assert cost.assigned_engine(staged[0], hw) == "vector"
    assert cost.formula_cycles(staged[0], hw) == max(hw.min_ii_cycles, 512)       # PSUM read on VectorE


# ------------------------------------------- 4. shared_hbm outputs under a trace-time if
@nki.jit
def output_under_if_k(x, *, cond):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    extra = None
    if cond == "flag":
        extra = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    elif cond == "program_id" and nl.program_id(0) == 0:
        extra = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    tile = nl.load(x)
    nl.store(out, value=tile)
    if extra is not None:
        nl.store(extra, value=nl.multiply(tile, 2.0))
        return out, extra
    return out


def test_output_under_trace_time_constant_if_passes(rng):
    x = rng.standard_normal((128, 8)).astype(np.float32)
    out, extra = nki.simulate_kernel(output_under_if_k, x, cond="flag")
    np.testing.assert_array_equal(out, x)
    np.testing.assert_array_equal(extra, 2.0 * x)


def test_output_under_program_id_if_fails(rng, rejects):
    x = rng.standard_normal((128, 8)).astype(np.float32)
    with rejects(SyntaxError, match="(?i)shared_hbm"):
        nki.simulate_kernel(output_under_if_k, x, cond="program_id")


def _flag_of(cond):
    return cond == "helper"


@nki.jit
def output_under_call_if_k(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    if _flag_of("helper"):
        extra = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(extra, value=nl.load(x))
    nl.store(out, value=nl.load(x))
    return out, extra


def test_output_under_unclassifiable_if_warns(rng, sim_only):
    from nki_sim import errors as E
    x = rng.standard_normal((128, 8)).astype(np.float32)
    with pytest.warns(E.NkiFrontEndWarning, match="cannot classify"):
        out, extra = nki.simulate_kernel(output_under_call_if_k, x)
    np.testing.assert_array_equal(extra, x)
