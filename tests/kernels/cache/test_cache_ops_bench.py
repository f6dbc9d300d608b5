"""Smoke tests of the two cache-op benchmark scripts: they run, print a Markdown table, write JSON,
and their own invariants hold (equal payload bytes across variants, fewer DMA instructions)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.simulation


def test_bench_cache_write_quick(tmp_path, capsys, load_script):
    out = tmp_path / "cw.json"
    assert load_script("bench_cache_write").main(["--quick", "--repeats", "1", "--json", str(out)]) == 0
    assert "| per-token DMA |" in capsys.readouterr().out
    rows = json.loads(out.read_text())["rows"]
    by = {(r["workload"], r["variant"]): r for r in rows}
    for (workload, variant), r in by.items():
        if variant == "per-token DMA":
            ours = by[(workload, "nki (128 rows/DMA)")]
            assert ours["dma_bytes"] == r["dma_bytes"]
            assert ours["dma_instructions"] * 10 < r["dma_instructions"]


def test_bench_block_copy_small(tmp_path, capsys, load_script):
    out = tmp_path / "bc.json"
    args = ["--layers", "2", "--blocks", "6", "--kv-heads", "1", "--block-size", "4",
            "--head-size", "8", "--json", str(out)]
    assert load_script("bench_block_copy").main(args) == 0
    assert "| coalesced |" in capsys.readouterr().out
    rows = json.loads(out.read_text())["rows"]
    for g in (1, 2, 3, 6):
        group = {r["variant"]: r for r in rows if r["groups"] == g}
        assert len({r["kv_bytes"] for r in group.values()}) == 1
        assert group["coalesced"]["dma_instructions"] < min(
            r["dma_instructions"] for v, r in group.items() if v != "coalesced")
