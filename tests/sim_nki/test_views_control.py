"""View edge cases and errors, dtype aliases, runtime control flow (fori / while / if_else /
dynamic_range) per NKI version."""

from __future__ import annotations

import numpy as np
import pytest

from nki_sim.current import use_nki_version
from nki_sim.errors import IndexingError, IndirectIndexError, NotEmulatedError
from sim_nki_util import load, nisa, nki, nl, out_of, sb

X = np.arange(8 * 12, dtype=np.float32).reshape(8, 12)


def test_negative_steps_expand_squeeze_and_flatten():
    @nki.jit
    def k(x):
        t = load(x)
        r1 = sb((8, 6))
        nisa.tensor_copy(dst=r1, src=t[:, ::-2])
        r2 = sb((8, 12))
        nisa.tensor_copy(dst=r2, src=t.reshape((8, 3, 4)).expand_dim(2).squeeze_dim(2).flatten_dims(1, 2))
        r3 = sb((4, 12))
        nisa.dma_copy(dst=r3, src=x.ap([[-12, 4], [1, 12]], offset=7 * 12))
        return out_of(r1), out_of(r2), out_of(r3)

    r1, r2, r3 = k(X)
    np.testing.assert_array_equal(r1, X[:, ::-2])
    np.testing.assert_array_equal(r2, X)
    np.testing.assert_array_equal(r3, X[7:3:-1])


@pytest.mark.parametrize("body, exc, msg", [
    (lambda t, x: t.permute((0, 2, 1)).reshape((8, 12)), ValueError, "needs a copy"),
    (lambda t, x: t.reshape((4, 24)), IndexingError, "must keep dim 0"),
    (lambda t, x: t.reshape((8, 5)), AssertionError, "must keep the element count"),
    (lambda t, x: t.permute((1, 0, 2)), IndexingError, "partition dim"),
    (lambda t, x: t.broadcast(1, 4), ValueError, "only size-1 dims"),
    (lambda t, x: t[:, 0, 0:1].squeeze_dim(1), IndexingError, "at least 2 dimensions"),
    (lambda t, x: x.ap([[12, 8], [1, 13]]), IndexError, "addresses elements"),
    (lambda t, x: t[9], IndexError, "dimension 0"),
])
def test_view_errors(body, exc, msg):
    @nki.jit
    def k(x):
        t = load(x).reshape((8, 3, 4))
        body(t, x)
        return nl.num_programs(0)

    with pytest.raises(exc, match=msg):
        k(X)


def test_indirect_views_and_scalar_offset_bounds():
    @nki.jit
    def k(x, off):
        to = load(off)
        v = x.ap([[12, 2], [1, 12]], offset=0, scalar_offset=to, indirect_dim=0)
        assert v.is_indirect() and not x.is_indirect()
        with pytest.raises(IndexingError, match="indirect view"):
            v[0:1]
        t = sb((2, 12))
        nisa.dma_copy(dst=t, src=v)
        return out_of(t)

    np.testing.assert_array_equal(k(X, np.array([[5]], np.int32)), X[5:7])
    with pytest.raises(IndirectIndexError, match="scalar_offset 7 moves the access"):
        k(X, np.array([[7]], np.int32))


def test_same_size_dtype_alias_shares_written_state():
    @nki.jit
    def k(x):
        t = sb((8, 12))
        nisa.dma_copy(dst=t.view(nl.int32), src=x.view(nl.int32))     # write through the alias
        r = sb((8, 12))
        nisa.tensor_copy(dst=r, src=t)                                  # read as float32: written
        return out_of(r)

    np.testing.assert_array_equal(k(X), X)


def test_while_loop_dynamic_range_and_loop_errors():
    @nki.jit
    def k(x):
        acc = sb((8, 12))
        nisa.memset(dst=acc, value=0.0)
        one = load(x)
        n = nisa.register_alloc(3)

        def body():
            nisa.tensor_tensor(dst=acc, data1=acc, data2=one, op=nl.add)
            nisa.register_move(n, n - 1)
            return n
        nl.while_loop(n, body)
        for r in nl.dynamic_range(2):
            nisa.tensor_tensor(dst=acc, data1=acc, data2=one, op=nl.add)
        with pytest.raises(SyntaxError, match="must not return a value"):
            nl.fori_loop(0, 1, lambda i: 1)
        with nl.no_reorder(), pytest.raises(SyntaxError, match="no_reorder"):
            nl.fori_loop(0, 1, lambda i: None)
        with pytest.raises(NotEmulatedError, match="unroll=True"):
            nl.fori_loop(0, 1, lambda i: None, unroll=True)
        return out_of(acc)

    with use_nki_version("0.6"), pytest.warns(DeprecationWarning, match="dynamic_range"):
        np.testing.assert_array_equal(k(X), 5 * X)
    with pytest.raises(AttributeError, match="dynamic_range"):
        nl.dynamic_range

    @nki.jit
    def unrolled(x):
        seen = []
        nl.fori_loop(0, 3, lambda i: seen.append(i), unroll=True)
        return tuple(seen)

    assert unrolled(X) == (0, 1, 2)
