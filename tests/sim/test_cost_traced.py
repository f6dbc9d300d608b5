"""Cost-model calibration on events produced by the simulator (not hand-built): the two DMA
examples AWS profiled on trn2 ("Introduction to DMA with NKI"), written as NKI kernels.

  * A[4,4096] bf16 HBM->SBUF: one engine, 32 KiB, 1416 ns.
  * A[128,128] bf16 HBM->SBUF: 16 engines, each one 2 KiB read of ~97 ns.
Tolerance 10 % (as tests/sim/test_cost.py).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nki_sim
from nki_sim import cost

pytestmark = pytest.mark.simulation
RTOL = 0.10


def _kernel():
    from nki_kernels.toolchain import nki, nl

    @nki.jit
    def copy_through_sbuf(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        tile = nl.load(x)
        nl.store(out, value=tile)
        return out

    return nki, copy_through_sbuf


def _traced_load(shape, target="trn2"):
    nki, kern = _kernel()
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape).astype(ml_dtypes.bfloat16)
    with nki_sim.use_target(target), nki_sim.tracing() as trace:
        out = nki.simulate_kernel(kern, x)
    np.testing.assert_array_equal(np.asarray(out), x)
    loads = [e for e in trace.events if e.engine == "dma" and e.op == "load"]
    assert len(loads) == 1
    return loads[0], trace


def test_traced_single_engine_32kib_load(sim_only):
    ev, _ = _traced_load((4, 4096))
    c = cost.dma_instruction_cost(ev, cost.TRN2)
    assert c.engines_used == 1
    assert c.transfer_ns.max() == pytest.approx(1416.0, rel=RTOL)


def test_traced_128x128_load_is_16_parallel_2kib_reads(sim_only):
    ev, _ = _traced_load((128, 128))
    assert ev.attr("hbm_contiguous") is True
    c = cost.dma_instruction_cost(ev, cost.TRN2)
    assert c.engines_used == 16
    assert c.transfer_ns == pytest.approx([97.0] * 16, rel=RTOL)


def test_traced_strided_load_is_not_merged(sim_only):
    """Half the columns of each row: 128 separate 128 B runs, overhead-bound, no merging."""
    from nki_kernels.toolchain import nki, nl

    @nki.jit
    def half_columns(x):
        out = nl.ndarray((128, 64), dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.load(x[:, 0:64]))
        return out

    x = np.ones((128, 128), dtype=ml_dtypes.bfloat16)
    with nki_sim.tracing() as trace:
        nki.simulate_kernel(half_columns, x)
    ev = next(e for e in trace.events if e.op == "load")
    assert ev.attr("hbm_contiguous") is False
    merged = cost.dma_instruction_cost(_traced_load((128, 64))[0], cost.TRN2)
    strided = cost.dma_instruction_cost(ev, cost.TRN2)
    assert strided.transfer_ns.max() > 1.5 * merged.transfer_ns.max()


def test_traced_whole_trace_estimate_on_both_targets(sim_only):
    _, trace = _traced_load((128, 128))
    r1, r2 = cost.estimate(trace, "trn1"), cost.estimate(trace, "trn2")
    for r in (r1, r2):
        assert r.dma_instructions == 2 and r.hbm_bytes == 2 * 128 * 128 * 2
        assert 0 < r.lower_bound_us <= r.modeled_us <= r.upper_bound_us
        assert 0 < r.fraction_of_roofline <= 1
    # trn1 engines are slower (17 vs 23 B/ns)
    assert r1.dma_engine_max_us > r2.dma_engine_max_us
    assert cost.estimate(trace.events, "trn2") == r2
