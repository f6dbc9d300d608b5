"""``ops.where_chunks``, ``ops.tensor_scalar_columns`` and ``ops.tensor_tensor_columns`` (both op
layers): a select per chunk with one flag each into a strided destination, and element-wise
ops on every k-th column -- one instruction each. Checked against NumPy on every API and
target pair the product runs; the dense kernel's garbage isolation
(``nki_kernels.dense.finite``) is built on them."""

from __future__ import annotations

import numpy as np
import pytest

import nki_sim
from host.launch import launch_kernel
from nki_kernels.ops import KernelFamily

pytestmark = pytest.mark.simulation
P, N, D = 128, 4, 8          # partitions, chunks, chunk width
W = D + 1                    # destination stride: a gap column after every chunk
PAIRS = [("trn1", "legacy"), ("trn2", "legacy"), ("trn2", "nki")]


def _build(ops):
    def columns_kernel(x, flags, b):
        """x (P, N*D) fp32, flags (P, N) fp32 0/1, b (P, N) fp32 -> (P, N*W) fp32: chunk k of x
        where flags[:, k] else -7 in columns [k*W, k*W + D), then column k*W + D =
        2 * flags[:, k] + 1, plus b[:, k]."""
        out = ops.ndarray((P, N * W), dtype=ops.float32, buffer=ops.SHARED_HBM)
        xs, fs, bs = (ops.sbuf((P, t.shape[1]), ops.float32) for t in (x, flags, b))
        for dst, src in ((xs, x), (fs, flags), (bs, b)):
            ops.load(dst, src)
        pred = ops.sbuf((P, N), ops.PRED)
        ops.tensor_scalar(pred, fs, "equal", 1.0)
        res = ops.sbuf((P, N * W), ops.float32)
        ops.memset(res, 0.0)
        ops.where_chunks(res, W, pred, xs, N, D, on_false=-7.0)
        ops.tensor_scalar_columns(res, D, W, fs, "multiply", 2.0, op1="add", operand1=1.0)
        ops.tensor_tensor_columns(res, D, W, bs, "add")
        ops.dma(out, res)
        return out

    return columns_kernel


KERNEL = KernelFamily(_build, "columns_kernel")


def _inputs(seed=5):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((P, N * D)).astype(np.float32)
    x[3, 2] = np.nan                                   # a NaN where its chunk is not selected
    flags = (rng.random((P, N)) < 0.5).astype(np.float32)
    flags[3, 0] = 0.0
    b = rng.standard_normal((P, N)).astype(np.float32)
    return x, flags, b


def _expected(x, flags, b):
    out = np.zeros((P, N * W), np.float32)
    for k in range(N):
        out[:, k * W:k * W + D] = np.where(flags[:, k:k + 1] == 1.0, x[:, k * D:(k + 1) * D], -7.0)
        out[:, k * W + D] = 2.0 * flags[:, k] + 1.0 + b[:, k]
    return out


@pytest.mark.parametrize("target, api", PAIRS)
def test_chunk_selects_and_strided_columns_match_numpy(target, api):
    x, flags, b = _inputs()
    with nki_sim.use_target(target), nki_sim.tracing() as trace:
        got = launch_kernel(KERNEL, (x, flags, b), {}, grid_heads=1, backend="sim", api=api)
    assert np.array_equal(got, _expected(x, flags, b))
    assert np.isfinite(got).all()                       # the NaN sat in an unselected chunk
    # one instruction each (the op layer's promise): a select, two column ops after the memset
    writes = [e for e in trace.events if e.engine != "dma" and e.op not in ("memset",)]
    assert len(writes) == 4, [e.op for e in writes]     # the flags compare + the three ops


@pytest.mark.parametrize("target, api", PAIRS)
def test_one_flag_moves_exactly_its_chunk_and_column(target, api):
    """Flipping one chunk's flag changes that chunk's D values and its flag column, nothing
    else (a broadcast of the flag over the wrong chunk or stride would change more)."""
    x, flags, b = _inputs(6)
    flipped = flags.copy()
    flipped[9, 1] = 1.0 - flipped[9, 1]
    with nki_sim.use_target(target):
        one, two = (launch_kernel(KERNEL, (x, f, b), {}, grid_heads=1, backend="sim", api=api)
                    for f in (flags, flipped))
    rows, cols = np.nonzero(one != two)
    assert set(rows) == {9} and list(cols) == list(range(W, 2 * W))
