"""Checks of the block-KV (key_cache, value_cache) pair: every bad pair is refused before
anything runs (ValueError naming the argument, the constraint and the value), the kernels that
read only the fused layout say what to pass instead (NotImplementedError), a plan's layout and
a layer's cache must agree, and the kernel itself checks its layout arguments (must-fail and
must-pass twins)."""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest

import host.attention as attention
from host.attention import flash_attn_varlen_nkifunc, paged_attention, run_paged_attention
from host.reference import paged_attention_ref
from host.scheduled.scheduled import build_overlay, launch_args, pack_queries, unpack_output
from host.step_plan import plan_paged_attention
from nki_kernels.scheduled.scheduled_attention import scheduled_paged_attention

pytestmark = pytest.mark.simulation
N, B, HKV, D, H = 6, 16, 2, 8, 4


def _batch(rng):
    q = rng.standard_normal((4, H, D)).astype(np.float32)
    kv = rng.standard_normal((4, HKV, D)).astype(np.float32)
    vllm = rng.standard_normal((2, N, B, HKV, D)).astype(np.float32)
    bt = np.array([[1, 2], [3, -1]], np.int32)
    return q, kv, vllm, bt, np.array([3, 1]), np.array([20, 5])


@pytest.fixture
def no_launch(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a kernel was launched")
    monkeypatch.setattr(attention, "launch_kernel", refuse)


@pytest.mark.parametrize("case, exc, match", [
    ("value_shape", ValueError, r"kv_cache\[1\] \(value_cache\) must have the shape \(6, 16, 2, 8\)"),
    ("rank", ValueError, r"kv_cache\[0\] \(key_cache\) must have shape \(num_blocks, block_size, "
                         r"num_kv_heads, head_size\).*got shape \(96, 2, 8\)"),
    ("dtype", ValueError, r"kv_cache\[0\] \(key_cache\).dtype must equal query.dtype \(float32\)"
                          r".*float16"),
    ("head_size", ValueError, r"kv_cache\[0\] \(key_cache\) must have shape \(num_blocks, "
                              r"block_size, Hkv, d\) with d = query.shape\[2\] = 8"),
    ("strided", ValueError, r"kv_cache\[0\] \(key_cache\) must be C-contiguous \(the kernel reads "
                            r"it in place"),
    ("overlap", ValueError, "non-overlapping key and value caches"),
    ("heads", ValueError, r"key must have shape \(4, 3, 8\)"),
    ("fp8", NotImplementedError, r"float8_e4m3fn block-KV cache is not supported; use the "
                                 r"\(2, N, Hkv, B, d\) layout"),
    ("dense", NotImplementedError, r"dense kernel .* reads a fused \(2, N, Hkv, B, d\) kv_cache "
                                   r"only; use kernel='scheduled'"),
    ("block_id", ValueError, "block_tables"),
])
def test_bad_pairs_are_refused_before_anything_runs(rng, no_launch, case, exc, match):
    q, kv, vllm, bt, ql, cl = _batch(rng)
    k, v = vllm[0], vllm[1]
    kw = {}
    if case == "value_shape":
        v = np.zeros((N, B, HKV, 4), np.float32)
    if case == "rank":
        k = k.reshape(N * B, HKV, D)
    if case == "dtype":
        k, v = k.astype(np.float16), v.astype(np.float16)
    if case == "head_size":
        k, v = np.zeros((N, B, HKV, 4), np.float32), np.zeros((N, B, HKV, 4), np.float32)
    if case == "strided":
        k = np.zeros((N, B, 2 * HKV, D), np.float32)[:, :, ::2]
        v = np.zeros((N, B, HKV, D), np.float32)
    if case == "overlap":
        v = k
    if case == "heads":
        k = np.zeros((N, B, 3, D), np.float32)
        v = np.zeros((N, B, 3, D), np.float32)
    if case == "fp8":
        k = k.astype(ml_dtypes.float8_e4m3fn)
        v = v.astype(ml_dtypes.float8_e4m3fn)
        kw = dict(k_scale=1.0, v_scale=1.0)
    if case == "dense":
        kw = dict(kernel="dense")
    if case == "block_id":
        bt = np.array([[1, N], [3, -1]], np.int32)
    with pytest.raises(exc, match=match):
        paged_attention(q, kv, kv, (k, v), bt, ql, cl, backend="sim", **kw)


def test_a_layer_cache_must_be_in_the_plans_layout(rng, no_launch):
    q, kv, vllm, bt, ql, cl = _batch(rng)
    geo = dict(num_heads=H, num_kv_heads=HKV, head_size=D, block_size=B, num_blocks=N,
               dtype=np.float32, backend="sim")
    fused = np.ascontiguousarray(vllm.transpose(0, 1, 3, 2, 4))
    plan_f = plan_paged_attention(bt, ql, cl, **geo)
    plan_b = plan_paged_attention(bt, ql, cl, kv_layout="block_kv", **geo)
    assert (plan_f.kv_layout, plan_b.kv_layout) == ("fused", "block_kv")
    with pytest.raises(ValueError, match=r"kv_cache must be one \(2, N, Hkv, B, d\) array: the "
                                         r"plan was built with kv_layout='fused'"):
        run_paged_attention(plan_f, q, kv, kv, (vllm[0], vllm[1]))
    with pytest.raises(ValueError, match=r"kv_cache must be a \(key_cache, value_cache\) pair .*"
                                         r"kv_layout='block_kv'"):
        run_paged_attention(plan_b, q, kv, kv, fused)
    small = tuple(np.zeros((N - 1, B, HKV, D), np.float32) for _ in range(2))
    with pytest.raises(ValueError, match=r"kv_cache\[0\] \(key_cache\) must have shape "
                                         r"\(6, 16, 2, 8\) \(num_blocks, block_size, Hkv, d\) of "
                                         r"the plan"):
        run_paged_attention(plan_b, q, kv, kv, small)
    with pytest.raises(ValueError, match="kv_layout must be one of"):
        plan_paged_attention(bt, ql, cl, kv_layout="vllm", **geo)
    with pytest.raises(NotImplementedError, match="fp8 block-KV"):
        plan_paged_attention(bt, ql, cl, kv_layout="block_kv", kv_cache_dtype="float8_e5m2",
                             k_scale=1.0, v_scale=1.0, **geo)


def test_fused_only_entry_points_say_what_to_pass(rng):
    from host.mla.mla_attention import mla_paged_attention

    q, kv, vllm, bt, ql, cl = _batch(rng)
    with pytest.raises(NotImplementedError, match=r"use host.paged_attention"):
        flash_attn_varlen_nkifunc(q, kv, kv, (vllm[0], vllm[1]), bt[0], None)
    lat = np.zeros((N, B, 576), np.float32)
    with pytest.raises(NotImplementedError, match=r"pass the \(num_blocks, block_size, "
                                                  r"entry_size\) latent cache"):
        mla_paged_attention(np.zeros((4, 2, 576), np.float32), (lat, lat), bt, ql, cl + ql)


@pytest.mark.parametrize("api", ["legacy", "nki"])
def test_the_kernel_checks_its_layout_arguments(rng, api, on_api, tol):
    """kv_layout="block_kv" needs the key cache as kv_cache and a value_cache of its shape and
    dtype; the fused layout refuses a value_cache. Must-pass twin: the right call runs."""
    q, kv, vllm, bt, ql, cl = _batch(rng)
    k, v = vllm[0], vllm[1]
    plan = plan_paged_attention(bt, ql, cl, num_heads=H, num_kv_heads=HKV, head_size=D,
                                block_size=B, num_blocks=N, dtype=np.float32, backend="sim",
                                kv_layout="block_kv")
    (part,) = plan.parts
    launch = part.launch
    overlay = build_overlay(part.schedule, (k, v), kv, kv, plan.block_tables)
    args, inputs = launch_args(launch, pack_queries(launch.cls, q, HKV), k, overlay)
    assert args[2] is k
    opts = part.kernel_kwargs["options"]
    assert opts.kv_layout == "block_kv"
    with on_api(api):
        from host.launch import launch_kernel

        def sim(*a, **kw):
            return launch_kernel(scheduled_paged_attention, a, {**inputs, **kw}, grid_heads=HKV,
                                 backend="sim", api=api)

        with pytest.raises(ValueError, match=r"value_cache must be the value cache, shape "
                                             r"\(6, 16, 2, 8\)"):
            sim(*args, options=opts)
        with pytest.raises(ValueError, match="value_cache must be the value cache"):
            sim(*args, options=opts, value_cache=v[:, :, :1].copy())
        with pytest.raises(ValueError, match=r"kv_cache.shape must be the key cache"):
            sim(*args[:2], vllm, *args[3:], options=opts, value_cache=v)
        fused_opts = dataclasses.replace(opts, kv_layout="fused")
        with pytest.raises(ValueError, match="value_cache must be None with kv_layout='fused'"):
            sim(*args, options=fused_opts, value_cache=v)
        out = sim(*args, options=opts, value_cache=v)          # must pass
    result = np.zeros_like(q)
    unpack_output(launch.cls, np.asarray(out), result)
    ref = paged_attention_ref(q, kv, kv, np.ascontiguousarray(vllm.transpose(0, 1, 3, 2, 4)), bt,
                              ql, cl)
    atol, rtol = tol("mixed", np.float32)
    assert np.all(np.abs(result - ref) <= atol + rtol * np.abs(ref))
