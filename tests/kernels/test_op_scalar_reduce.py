"""``ops.scalar_reduce`` and ``ops.tensor_reduce(negate=True)`` (both op layers): one VectorE
``tensor_scalar_reduce`` -- ``data op0 operand0`` element-wise and its row reduction. As a copy
of PSUM scores with their row max (``op0`` multiply by 1.0, max-reduced), and as the decode
step's new running max (negated chunk maxima clamped by a (P, 1) column and min-reduced,
``sched_core.new_max_of_negated``). Checked against NumPy on every API and target pair the
product runs."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nki_sim
from host.launch import launch_kernel
from nki_kernels.ops import KernelFamily
from nki_kernels.tile_ops import identity_tile

pytestmark = pytest.mark.simulation
P, W = 128, 512
PAIRS = [("trn1", "legacy"), ("trn2", "legacy"), ("trn2", "nki")]


def _build(ops):
    def scalar_reduce_kernel(x, col, use_reduce):
        """x (128, 512) bf16, col (128, 1) fp32 -> (128, 516) fp32: x through PSUM (an identity
        matmul); columns 0..511 and 512: its copy and row max by scalar_reduce; 513: the row max
        by tensor_reduce; 514: min(col, -max) by a negated tensor_reduce and scalar_reduce (op0
        minimum against col, min-reduced); 515: the negated row max."""
        out = ops.ndarray((P, W + 4), dtype=ops.float32, buffer=ops.SHARED_HBM)
        xs = ops.sbuf((P, W), x.dtype)
        ops.load(xs, x)
        cs = ops.sbuf((P, 1), ops.float32)
        ops.load(cs, col)
        ps = ops.psum((P, W), ops.float32)
        ops.matmul(ps, identity_tile(ops, P, x.dtype), xs)
        res = ops.sbuf((P, W + 4), ops.float32)
        ops.memset(res, 0.0)
        if use_reduce:
            ops.scalar_reduce(res[:, ops.ds(0, W)], ps, "multiply", 1.0, "max",
                              res[:, ops.ds(W, 1)])
        ops.tensor_reduce(res[:, ops.ds(W + 1, 1)], "max", ps, axis=(1,), keepdims=True)
        neg = ops.sbuf((P, 4), ops.float32)
        ops.tensor_reduce(neg, "max", ops.free_view(ps, ((128, 4), (1, 128))), axis=(2,),
                          negate=True)
        ops.copy(res[:, ops.ds(W + 3, 1)], neg[:, ops.ds(0, 1)], engine="vector")
        if use_reduce:
            clamped = ops.sbuf((P, 4), ops.float32)
            ops.scalar_reduce(clamped, neg, "minimum", cs, "min", res[:, ops.ds(W + 2, 1)])
        ops.dma(out, res)
        return out

    return scalar_reduce_kernel


KERNEL = KernelFamily(_build, "scalar_reduce_kernel")


def _inputs():
    rng = np.random.default_rng(71)
    x = (rng.standard_normal((P, W)) * 8).astype(ml_dtypes.bfloat16)
    col = (rng.standard_normal((P, 1)) * 8).astype(np.float32)
    return x, col


@pytest.mark.parametrize("target, api", PAIRS)
def test_scalar_reduce_copies_psum_and_reduces_its_rows(target, api):
    x, col = _inputs()
    with nki_sim.use_target(target), nki_sim.tracing() as trace:
        got = launch_kernel(KERNEL, (x, col, True), {}, grid_heads=1, backend="sim", api=api)
    ref = x.astype(np.float64)
    assert np.array_equal(got[:, :W], ref)                       # the copy is exact
    assert np.array_equal(got[:, W], ref.max(axis=1))             # its row max
    assert np.array_equal(got[:, W], got[:, W + 1])               # = a tensor_reduce
    assert np.array_equal(got[:, W + 3], -ref[:, :128].max(axis=1))        # negate=True
    assert np.array_equal(got[:, W + 2], np.minimum(col[:, 0], -ref.max(axis=1)))
    ev = [e for e in trace.events if e.op == "tensor_scalar_reduce"]
    assert len(ev) == 2 and {e.engine for e in ev} == {"vector"}
    assert ev[0].src_buffer == "psum" and ev[0].dst_buffer == "sbuf" and ev[0].free_elems == W


def test_without_scalar_reduce_the_columns_stay_unwritten():
    """The other side: the same kernel without the two scalar_reduce calls leaves their columns
    zero."""
    x = np.ones((P, W), ml_dtypes.bfloat16)
    col = np.full((P, 1), -5.0, np.float32)
    with nki_sim.use_target("trn1"):
        got = launch_kernel(KERNEL, (x, col, False), {}, grid_heads=1, backend="sim",
                            api="legacy")
    assert not got[:, :W + 1].any() and not got[:, W + 2].any()
    assert np.array_equal(got[:, W + 1], np.ones(P, np.float32))
