"""Integration: a small causal attention kernel (tests/sim/kernels/attention_kernels.py,
written for real NKI) against a float64 NumPy reference, on trn1 and trn2."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import neuronxcc.nki as nki

pytestmark = pytest.mark.simulation


def causal_attention_ref(q, k, v, scale):
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    s = q @ k.T * scale
    s = np.where(np.tril(np.ones(s.shape, bool)), s, -np.inf)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ v


@pytest.mark.parametrize("seq,head", [(128, 64), (384, 128)])
@pytest.mark.parametrize("mixed,dtype,atol", [(False, np.float32, 1e-4),
                                              (True, np.float32, 2e-2),
                                              (True, ml_dtypes.bfloat16, 3e-2)])
def test_causal_attention_matches_numpy(attention, rng, seq, head, mixed, dtype, atol):
    q, k, v = (rng.standard_normal((seq, head)).astype(dtype) for _ in range(3))
    scale = 1.0 / np.sqrt(head)
    out = nki.simulate_kernel(attention.causal_attention, q, k, v, softmax_scale=scale,
                              mixed_precision=mixed)
    assert out.shape == (seq, head) and out.dtype == np.dtype(dtype)
    np.testing.assert_allclose(out.astype(np.float64), causal_attention_ref(q, k, v, scale),
                               atol=atol, rtol=0)


@pytest.mark.parametrize("name", ["trn1", "trn2"])
def test_causal_attention_on_both_targets(attention, rng, target, name):
    q, k, v = (rng.standard_normal((256, 64)).astype(ml_dtypes.bfloat16) for _ in range(3))
    with target(name):
        out = nki.simulate_kernel(attention.causal_attention, q, k, v, softmax_scale=0.125,
                                  mixed_precision=True)
    np.testing.assert_allclose(out.astype(np.float64), causal_attention_ref(q, k, v, 0.125),
                               atol=3e-2, rtol=0)


def test_causal_mask_matters(attention, rng):
    # guards the reference comparison: a non-causal result differs from the kernel output
    q, k, v = (rng.standard_normal((128, 32)).astype(np.float32) for _ in range(3))
    out = nki.simulate_kernel(attention.causal_attention, q, k, v, softmax_scale=0.2,
                              mixed_precision=False)
    s = q.astype(np.float64) @ k.T * 0.2
    p = np.exp(s - s.max(axis=1, keepdims=True))
    full = (p / p.sum(axis=1, keepdims=True)) @ v
    assert np.abs(out - full).max() > 0.1
