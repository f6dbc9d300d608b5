"""Property test: views of the current API address the same elements NumPy does."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from sim_nki_util import load, nisa, nki, nl, out_of, sb


@st.composite
def views(draw):
    shape = (draw(st.integers(1, 6)), draw(st.integers(1, 5)), draw(st.integers(1, 7)))
    key = []
    for d, n in enumerate(shape):
        if d > 0 and draw(st.booleans()) and n > 1:
            key.append(draw(st.integers(0, n - 1)))
            continue
        a = draw(st.integers(0, n - 1))
        b = draw(st.integers(a + 1, n))
        key.append(slice(a, b, draw(st.integers(1, 3))))
    return shape, tuple(key), draw(st.booleans())


@settings(max_examples=15, deadline=None, derandomize=True)
@given(views())
def test_subscripts_match_numpy(case):
    shape, key, onchip = case
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)

    @nki.jit
    def k(x):
        src = load(x) if onchip else x
        v = src[key]
        if v.ndim == 1:
            v = v.reshape((v.shape[0], 1)) if onchip else v.reshape((1, v.shape[0]))
        t = sb(v.shape)
        (nisa.tensor_copy if onchip else nisa.dma_copy)(dst=t, src=v)
        return out_of(t)

    ref = x[key]
    np.testing.assert_array_equal(k(x).reshape(-1), ref.reshape(-1))


@settings(max_examples=12, deadline=None, derandomize=True)
@given(st.integers(1, 4), st.integers(1, 6), st.integers(0, 3), st.integers(-2, 3), st.integers(1, 3))
def test_access_patterns_match_flat_strides(p, f, off, step, n):
    x = np.arange(4 * 64, dtype=np.float32)
    base = 64 + off
    pattern = [[16, p], [step, n], [1, f]]

    @nki.jit
    def k(x):
        t = sb((p, n, f))
        nisa.dma_copy(dst=t, src=x.ap(pattern, offset=base))
        return out_of(t)

    i, j, m = np.ix_(range(p), range(n), range(f))
    np.testing.assert_array_equal(k(x), x[base + 16 * i + step * j + m])
