"""The documented NKI type-promotion table (API notes section 2.6), fp8 storage through
ml_dtypes, and the function form nl.broadcast_to."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

pytestmark = pytest.mark.simulation

BF16 = np.dtype(ml_dtypes.bfloat16)
E4M3 = np.dtype(ml_dtypes.float8_e4m3)
E5M2 = np.dtype(ml_dtypes.float8_e5m2)
F16, F32 = np.dtype(np.float16), np.dtype(np.float32)
I8, U8, I16, U16, I32, U32 = (np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16,
                                                       np.int32, np.uint32))

# (a, b) -> result of an nl binary op without dtype=, from the documented table
PROMOTION = [
    (F16, BF16, F32), (E4M3, F16, F16), (E4M3, BF16, BF16), (E4M3, E5M2, BF16),
    (F32, BF16, F32), (I32, F16, F16), (U8, BF16, BF16),
    (I8, U8, I16), (I8, U16, I32), (U16, I32, I32), (I32, U32, F32), (I8, I16, I16),
]


@nki.jit
def promote_k(a, b):
    res = nl.add(nl.load(a), nl.load(b))
    out = nl.ndarray(a.shape, dtype=res.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=res)
    return out


@pytest.mark.parametrize("da,db,expected", PROMOTION,
                         ids=[f"{a.name}+{b.name}" for a, b, _ in PROMOTION])
def test_documented_type_promotion(da, db, expected):
    a = np.full((4, 8), 2, dtype=np.int32).astype(da)
    b = np.full((4, 8), 3, dtype=np.int32).astype(db)
    out = nki.simulate_kernel(promote_k, a, b)
    assert out.dtype == expected
    np.testing.assert_array_equal(out.astype(np.float64), 5.0)


def test_fp8_dtypes_map_to_ml_dtypes():
    assert np.dtype(nl.float8_e4m3) == E4M3 and np.dtype(nl.float8_e5m2) == E5M2


@nki.jit
def fp8_k(x, s8, m8):
    """(x cast to e4m3 and e5m2 by nl.copy, nc_matmul of two e4m3 tiles into fp32 PSUM)."""
    o4 = nl.ndarray(x.shape, dtype=nl.float8_e4m3, buffer=nl.shared_hbm)
    o5 = nl.ndarray(x.shape, dtype=nl.float8_e5m2, buffer=nl.shared_hbm)
    omm = nl.ndarray((s8.shape[1], m8.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    tile = nl.load(x)
    nl.store(o4, value=nl.copy(tile, dtype=nl.float8_e4m3))
    nl.store(o5, value=nl.copy(tile, dtype=nl.float8_e5m2))
    nl.store(omm, value=nl.copy(nisa.nc_matmul(nl.load(s8), nl.load(m8))))
    return o4, o5, omm


def test_fp8_storage_rounding_and_matmul(rng):
    x = rng.uniform(-8, 8, size=(32, 16)).astype(np.float32)
    s8 = rng.uniform(-2, 2, size=(64, 16)).astype(E4M3)
    m8 = rng.uniform(-2, 2, size=(64, 24)).astype(E4M3)
    o4, o5, omm = nki.simulate_kernel(fp8_k, x, s8, m8)
    np.testing.assert_array_equal(o4.view(np.uint8), x.astype(E4M3).view(np.uint8))
    np.testing.assert_array_equal(o5.view(np.uint8), x.astype(E5M2).view(np.uint8))
    ref = s8.astype(np.float64).T @ m8.astype(np.float64)      # fp8 products are exact in fp32
    np.testing.assert_allclose(omm, ref, rtol=1e-6, atol=1e-6)


@nki.jit
def broadcast_fn_k(row, col, *, parts, free):
    """nl.broadcast_to(row (1, F), shape=(P, F)) + nl.broadcast_to(col (P, 1), shape=(P, F))."""
    out = nl.ndarray((parts, free), dtype=nl.float32, buffer=nl.shared_hbm)
    r = nl.broadcast_to(nl.load(row), shape=(parts, free))
    c = nl.broadcast_to(nl.load(col), shape=(parts, free))
    nl.store(out, value=nl.add(r, c))
    return out


def test_nl_broadcast_to_function(rng, rejects):
    row = rng.standard_normal((1, 24)).astype(np.float32)
    col = rng.standard_normal((64, 1)).astype(np.float32)
    out = nki.simulate_kernel(broadcast_fn_k, row, col, parts=64, free=24)
    np.testing.assert_allclose(out, row.astype(np.float64) + col, rtol=1e-6)
    with rejects(Exception, match=r"(?i)broadcast|shape"):
        nki.simulate_kernel(broadcast_fn_k, row, col, parts=64, free=48)
