"""scripts/bench_kv_layout.py on a small batch: both layouts on trn1 (legacy) and trn2 (nki)
give identical outputs (the script checks), and the block-KV layout's cache gathers cost more
DMA descriptors than the fused layout's when Hkv > 1."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.simulation


def test_small_batch_rows(load_script):
    bench = load_script("bench_kv_layout")
    from _pa_workloads import Workload

    w = Workload("tiny", "mixed", (1, 1, 40), (700, 300, 64))
    rows = bench.bench([w], heads=4, kv_heads=2, head_size=32)       # --api auto
    assert [(r["target"], r["api"], r["layout"]) for r in rows] == [
        ("trn1", "legacy", "fused"), ("trn1", "legacy", "block_kv"),
        ("trn2", "nki", "fused"), ("trn2", "nki", "block_kv")]
    for fused, blk in (rows[:2], rows[2:]):
        assert blk["dma_instructions"] == fused["dma_instructions"]
        assert blk["dma_descriptors"] > fused["dma_descriptors"]
        assert blk["modeled_us"] > 0 and fused["modeled_us"] > 0
    assert "MODELED" in bench.markdown(rows)
