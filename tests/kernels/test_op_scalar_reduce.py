"""``ops.copy_max`` (both op layers): one VectorE ``tensor_scalar_reduce`` that copies PSUM scores
into SBUF and takes each row's max -- what the scheduled kernel's query-rows steps do on
NeuronCore-v2, where VectorE and ScalarE take turns on PSUM. Checked against NumPy on every API
and target pair the product runs, and against the ``tensor_reduce`` it replaces."""

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


def _build(ops):
    def copy_max_kernel(x, use_copy_max):
        """x (128, 512) bf16 -> (128, 514) fp32: x through PSUM (an identity matmul), copied out
        by copy_max, then its row max from copy_max and from a tensor_reduce of PSUM."""
        out = ops.ndarray((P, W + 2), dtype=ops.float32, buffer=ops.SHARED_HBM)
        xs = ops.sbuf((P, W), x.dtype)
        ops.load(xs, x)
        ps = ops.psum((P, W), ops.float32)
        ops.matmul(ps, identity_tile(ops, P, x.dtype), xs)
        res = ops.sbuf((P, W + 2), ops.float32)
        ops.memset(res, 0.0)
        if use_copy_max:
            ops.copy_max(res[:, ops.ds(0, W)], ps, res[:, ops.ds(W, 1)])
        ops.tensor_reduce(res[:, ops.ds(W + 1, 1)], "max", ps, axis=(1,), keepdims=True)
        ops.dma(out, res)
        return out

    return copy_max_kernel


COPY_MAX = KernelFamily(_build, "copy_max_kernel")


@pytest.mark.parametrize("target, api", [("trn1", "legacy"), ("trn2", "legacy"), ("trn2", "nki")])
def test_copy_max_copies_psum_and_takes_the_row_max(target, api):
    rng = np.random.default_rng(71)
    x = (rng.standard_normal((P, W)) * 8).astype(ml_dtypes.bfloat16)
    with nki_sim.use_target(target), nki_sim.tracing() as trace:
        got = launch_kernel(COPY_MAX, (x, True), {}, grid_heads=1, backend="sim", api=api)
    ref = x.astype(np.float32)
    assert np.array_equal(got[:, :W], ref)                       # the copy is exact
    assert np.array_equal(got[:, W], ref.max(axis=1))             # its row max
    assert np.array_equal(got[:, W], got[:, W + 1])               # = the reduce it replaces
    ev = [e for e in trace.events if e.op == "tensor_scalar_reduce"]
    assert len(ev) == 1 and ev[0].engine == "vector" and ev[0].src_buffer == "psum"
    assert ev[0].dst_buffer == "sbuf" and ev[0].free_elems == W


def test_without_copy_max_the_columns_stay_unwritten():
    """The other side: the same kernel without the copy leaves the copy's columns zero."""
    x = np.ones((P, W), ml_dtypes.bfloat16)
    with nki_sim.use_target("trn1"):
        got = launch_kernel(COPY_MAX, (x, False), {}, grid_heads=1, backend="sim", api="legacy")
    assert not got[:, :W + 1].any() and np.array_equal(got[:, W + 1], np.ones(P, np.float32))
