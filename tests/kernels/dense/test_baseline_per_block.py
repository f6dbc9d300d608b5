"""Per-block baseline (nki_kernels/baselines/per_block_paged_attention.py) on nki_sim.

The baseline must be numerically correct (float64 reference, project tolerance table), produce
bit-for-bit the product kernel's output (only the KV-load DMAs differ), and issue exactly one
K DMA and one V DMA per context block of every large tile.
"""
from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import nki_sim

pytestmark = pytest.mark.simulation

ROOT = Path(__file__).resolve().parents[3]


def _bench():
    """scripts/bench_paged_attention.py (host-side input builder shared with the benchmark)."""
    name = "_bench_paged_attention"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, ROOT / "scripts" / "bench_paged_attention.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def _run(kernel, args, hkv, large_tile, target):
    from nki_kernels.toolchain import nki
    with nki_sim.use_target(target), nki_sim.tracing() as trace:
        out = nki.simulate_kernel(kernel[1, hkv], *args, LARGE_TILE_SZ=large_tile)
    return np.asarray(out), trace


# block_size, LARGE_TILE_SZ, (H, Hkv, d), query_lens, context_lens, target, dtype
CASES = [
    pytest.param(16, 2048, (4, 2, 64), (1, 1, 7, 1), (300, 2100, 40, 900), "trn2", "bfloat16",
                 id="b16_T1_trn2_bf16"),
    pytest.param(32, 2048, (2, 1, 32), (3, 1, 1), (2500, 70, 1200), "trn1", "float32",
                 id="b32_T2_trn1_fp32"),
    pytest.param(128, 1024, (3, 3, 16), (5, 1), (1500, 700), "trn2", "float32",
                 id="b128_T16_trn2_fp32"),
]


@pytest.mark.parametrize("block_size, tile, heads, q_lens, c_lens, target, dtype", CASES)
def test_per_block_matches_reference_and_product(block_size, tile, heads, q_lens, c_lens, target,
                                                 dtype, batch_factory, tol):
    from host.dense.plan import make_plan
    from host.reference import paged_attention_ref
    from nki_kernels.baselines.per_block_paged_attention import per_block_paged_attention
    from nki_kernels.constants import tile_geometry
    from nki_kernels.dense.flash_paged_attention import flash_paged_attention

    H, Hkv, d = heads
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    batch = batch_factory(block_size * 11 + tile, q_lens, c_lens, H=H, Hkv=Hkv, d=d,
                          block_size=block_size, dtype=dt)
    bench = _bench()
    args, T = bench.kernel_inputs(dict(query=batch.query, key=batch.key, value=batch.value,
                                       kv_cache=batch.kv_cache, block_tables=batch.block_tables,
                                       query_lens=batch.query_lens,
                                       context_lens=batch.context_lens), tile)
    mixed = True
    out_pb, tr_pb = _run(per_block_paged_attention, args, Hkv, tile, target)
    out_vec, tr_vec = _run(flash_paged_attention, args, Hkv, tile, target)

    # numerics: float64 reference from the definition, project tolerance
    ref = paged_attention_ref(*batch.args())
    got = out_pb[0, :, :T, :].transpose(1, 0, 2).astype(np.float64)
    atol, rtol = tol("mixed" if mixed else "fp32", dt)
    assert np.all(np.abs(got - ref) <= atol + rtol * np.abs(ref)), np.abs(got - ref).max()
    # only the KV load differs: same SBUF layout, so the same arithmetic, bit for bit
    assert np.array_equal(out_pb, out_vec)

    # DMA shape: one indirect K DMA and one V DMA per block per tile (T rows each), vs nL each
    plan = make_plan(batch.query_lens, batch.context_lens, block_size=block_size,
                     large_tile_size=tile)
    M, Tf, bp, _, n_loads = tile_geometry(block_size, tile)
    n_tiles = plan.num_large_tiles

    def kv_loads(trace):
        return [e for e in trace.events if e.engine == "dma" and e.dma_kind == "indirect"]

    pb, vec = kv_loads(tr_pb), kv_loads(tr_vec)
    assert len(pb) == 2 * M * n_tiles * Hkv
    assert len(vec) == 2 * n_loads * n_tiles * Hkv
    assert Counter(e.partitions for e in pb) == {Tf: len(pb)}
    row_bytes = bp * d * dt.itemsize
    assert {b for e in pb for b in e.descriptor_bytes} == {row_bytes}
    # same descriptors and bytes overall
    assert sum(e.bytes for e in pb) == sum(e.bytes for e in vec)
    assert sorted(b for e in pb for b in e.descriptor_bytes) == sorted(
        b for e in vec for b in e.descriptor_bytes)


def test_per_block_rejects_bad_input_like_the_product(batch_factory):
    """Validation is the product kernel's: a wrong block_tables dtype is a ValueError naming it."""
    from nki_kernels.baselines.per_block_paged_attention import per_block_paged_attention

    batch = batch_factory(5, (1,), (100,), H=2, Hkv=1, d=16, block_size=16)
    args, _ = _bench().kernel_inputs(dict(query=batch.query, key=batch.key, value=batch.value,
                                          kv_cache=batch.kv_cache, block_tables=batch.block_tables,
                                          query_lens=batch.query_lens,
                                          context_lens=batch.context_lens), 2048)
    bad = list(args)
    bad[4] = bad[4].astype(np.uint32)
    with pytest.raises(ValueError, match="block_tables.dtype"):
        _run(per_block_paged_attention, tuple(bad), 1, 2048, "trn2")
