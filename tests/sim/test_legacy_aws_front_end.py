"""Constructs AWS's legacy SD-attention tutorial and nki-samples kernels use that nki_sim used to
reject (nki_sim/README.md rule 6), each with its must-fail twin."""
from __future__ import annotations

import numpy as np
import pytest

import nki_sim
from nki_sim import errors as E

nki_sim.install()
import neuronxcc.nki as nki  # noqa: E402
import neuronxcc.nki.isa as nisa  # noqa: E402
import neuronxcc.nki.language as nl  # noqa: E402


@nki.jit
def _transpose_into_sbuf(x, *, op):
    out = nl.ndarray((x.shape[1], x.shape[0]), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.load(x)
    dst = nl.ndarray((x.shape[1], x.shape[0]), dtype=nl.float32, buffer=nl.sbuf)
    if op == "transpose":
        dst[...] = nisa.nc_transpose(t)                 # TensorE result assigned to SBUF
    else:
        ident = nl.load(x[:, 0:x.shape[0]])
        dst[...] = nisa.nc_matmul(ident, t)             # twin: a matmul result stays PSUM-only
    nl.store(out, value=dst)
    return out


def test_tensor_engine_transpose_into_sbuf_gets_the_psum_copy():
    x = np.random.default_rng(0).standard_normal((64, 96)).astype(np.float32)
    with nki_sim.use_target("trn1"), nki_sim.tracing() as t:
        out = _transpose_into_sbuf(x, op="transpose")
    np.testing.assert_array_equal(out, x.T)
    ops = [(e.engine, e.op, e.attr("implicit")) for e in t.events if e.engine != "dma"]
    assert ops == [("tensor", "nc_transpose", None), ("vector", "copy", True)]
    with pytest.raises(E.MemorySpaceError, match="Tensor Engine writes PSUM only"):
        _transpose_into_sbuf(np.ones((64, 128), np.float32), op="matmul")


@nki.jit
def _broadcast_reduction(x, *, rows):
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.load(x)
    s = nisa.tensor_reduce(np.add, data=t, axis=(1,))   # keepdims=False: shape (P,)
    b = (1.0 / s).broadcast_to((rows, x.shape[1]))
    nl.store(out, value=nl.multiply(t, b))
    return out


def test_broadcast_of_a_keepdims_false_reduction_aligns_on_partitions():
    x = np.random.default_rng(1).uniform(1, 2, (32, 16)).astype(np.float32)
    out = _broadcast_reduction(x, rows=32)
    np.testing.assert_allclose(out, x / x.astype(np.float64).sum(axis=1, keepdims=True), rtol=1e-6)
    with pytest.raises(ValueError, match="cannot broadcast tile"):
        _broadcast_reduction(x, rows=64)                # twin: partition counts differ
