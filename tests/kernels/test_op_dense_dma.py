"""The op-layer ops the dense kernel added (both op layers): ``where_max`` (a select with its row
max, current API; ``has_select_max``), ``load_cast`` (a direct load into a tile of another float
dtype), ``dma_transpose_block`` (one SBUF -> SBUF DMA
transpose of a 2-byte block, NeuronCore-v3+) and ``check_head_grid`` (the legacy ``[1, Hkv]``
grid; nothing to check on the current API). Each against NumPy, with a must-fail case."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nki_sim
from host.launch import launch_kernel
from nki_kernels.ops import KernelFamily

pytestmark = pytest.mark.simulation
BF16 = np.dtype(ml_dtypes.bfloat16)
PAIRS = [("trn1", "legacy"), ("trn2", "legacy"), ("trn2", "nki")]


def _build(ops):
    def dma_ops_kernel(x, y, transpose):
        """x (128, 128) float32, y (128, 128) bf16 -> (2, 128, 128) bf16: [0] x cast to bf16 by
        load_cast; [1] y, or y.T by dma_transpose_block (``transpose``)."""
        ops.check_head_grid("dma_ops_kernel", 1)
        out = ops.ndarray((2, 128, 128), dtype=ops.bfloat16, buffer=ops.SHARED_HBM)
        xs = ops.sbuf((128, 128), ops.bfloat16)
        ops.load_cast(xs, x)
        ys = ops.sbuf((128, 128), ops.bfloat16)
        ops.load_cast(ys, y)                      # same dtype: one DMA
        if transpose:
            yt = ops.sbuf((128, 128), ops.bfloat16)
            ops.dma_transpose_block(yt, ys)
            ys = yt
        ops.dma(out[0], xs)
        ops.dma(out[1], ys)
        return out

    return dma_ops_kernel


KERNEL = KernelFamily(_build, "dma_ops_kernel")


def _inputs():
    rng = np.random.default_rng(5)
    return (rng.standard_normal((128, 128)).astype(np.float32),
            rng.standard_normal((128, 128)).astype(BF16))


@pytest.mark.parametrize("target, api", PAIRS)
def test_load_cast(target, api):
    x, y = _inputs()
    with nki_sim.use_target(target), nki_sim.tracing() as trace:
        got = launch_kernel(KERNEL, (x, y, False), {}, grid_heads=1, backend="sim", api=api,
                            lnc=1)
    assert np.array_equal(got[0], x.astype(BF16))           # round to nearest even, as astype
    assert np.array_equal(got[1], y)
    loads = [e for e in trace.events if e.engine == "dma" and e.src_buffer == "hbm"]
    stores = [e for e in trace.events if e.engine == "dma" and e.dst_buffer == "hbm"]
    assert len(loads) == 2 and len(stores) == 2
    # the current API's DMA keeps the dtype: the float32 rows move as float32, then convert
    assert loads[0].bytes == 128 * 128 * 4


@pytest.mark.parametrize("api", ["legacy", "nki"])
def test_dma_transpose_block_on_neuroncore_v3(api):
    x, y = _inputs()
    with nki_sim.use_target("trn2"), nki_sim.tracing() as trace:
        got = launch_kernel(KERNEL, (x, y, True), {}, grid_heads=1, backend="sim", api=api,
                            lnc=1)
    assert np.array_equal(got[1], y.T)
    assert [e.op for e in trace.events if e.op == "dma_transpose"] == ["dma_transpose"]


def test_dma_transpose_block_is_refused_on_neuroncore_v2():
    # must-fail: NeuronCore-v2 has no DMA transpose (the dense kernel checks ops.nc_gen first)
    x, y = _inputs()
    with nki_sim.use_target("trn1"), pytest.raises(Exception, match="(?i)transpose"):
        launch_kernel(KERNEL, (x, y, True), {}, grid_heads=1, backend="sim", api="legacy")


def test_check_head_grid_on_the_legacy_grid():
    from nki_kernels.toolchain import nki

    x, y = _inputs()
    with nki_sim.use_target("trn1"):
        ok = nki.simulate_kernel(KERNEL.for_api("legacy")[1, 1], x, y, False)   # must-pass
        assert np.array_equal(np.asarray(ok)[1], y)
        with pytest.raises(ValueError, match=r"dma_ops_kernel: launch grid must be \[1, Hkv\] = "
                                             r"\[1, 1\]; got \[1, 2\]"):
            nki.simulate_kernel(KERNEL.for_api("legacy")[1, 2], x, y, False)    # must-fail


def _build_where_max(ops):
    def where_max_kernel(x, mask):
        """x (128, 512) float32, mask (128, 512) uint8 -> (128, 513) float32: where(mask, x, -1e30)
        and, in the last column, its row max (ops.where_max)."""
        out = ops.ndarray((128, 513), dtype=ops.float32, buffer=ops.SHARED_HBM)
        xs = ops.sbuf((128, 512), ops.float32)
        ops.load(xs, x)
        ms = ops.sbuf((128, 512), mask.dtype)
        ops.load(ms, mask)
        res = ops.sbuf((128, 513), ops.float32)
        ops.where_max(res[:, ops.ds(0, 512)], ms, xs, -1e30, res[:, ops.ds(512, 1)])
        ops.dma(out, res)
        return out

    return where_max_kernel


WHERE_MAX = KernelFamily(_build_where_max, "where_max_kernel")


def test_where_max_selects_and_reduces_on_the_current_api():
    from nki_kernels.ops import for_api

    rng = np.random.default_rng(8)
    x = rng.standard_normal((128, 512)).astype(np.float32)
    mask = (rng.random((128, 512)) < 0.3).astype(np.uint8)
    mask[5] = 0                                          # a row that sees nothing
    x[7, ~mask[7].astype(bool)] = np.nan                 # NaN only where the select drops it
    with nki_sim.use_target("trn2"):
        got = launch_kernel(WHERE_MAX, (x, mask), {}, grid_heads=1, backend="sim", api="nki",
                            lnc=1)
    want = np.where(mask.astype(bool), x, np.float32(-1e30))
    np.testing.assert_array_equal(got[:, :512], want)
    np.testing.assert_array_equal(got[:, 512], want.max(axis=1))
    assert for_api("nki").has_select_max() and not for_api("legacy").has_select_max()
    # must-fail: the legacy layer has no such op (callers check has_select_max first)
    with nki_sim.use_target("trn2"), pytest.raises(NotImplementedError, match="has_select_max"):
        launch_kernel(WHERE_MAX, (x, mask), {}, grid_heads=1, backend="sim", api="legacy")
