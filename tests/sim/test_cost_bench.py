"""scripts/bench_paged_attention.py end to end on a one-row slice (fast), and scripts/_progress.py.

This checks the benchmark's plumbing and JSON schema, not performance: the comparison itself is
the benchmark's output (MODELED figures, never asserted as timings here beyond the sign of the
effect the benchmark's acceptance line names).
"""
from __future__ import annotations

import io
import json

import pytest

pytestmark = pytest.mark.simulation


REQUIRED = {"workload", "target", "variant", "dma_instructions", "dma_bytes", "modeled_us",
            "block_size", "context", "descriptors", "fraction_of_roofline"}


def test_bench_quick_slice_json(tmp_path, capsys, sim_only, load_script):
    bench = load_script("bench_paged_attention")
    out = tmp_path / "rows.json"
    assert bench.main(["--quick", "--workloads", "decode", "--block-sizes", "16",
                       "--targets", "trn1", "--json", str(out), "--no-progress"]) == 0
    rows = json.loads(out.read_text())
    assert len(rows) == 2 and {r["variant"] for r in rows} == {"vectorized", "per_block"}
    for r in rows:
        assert REQUIRED <= set(r)
        assert r["workload"] == "decode" and r["target"] == "trn1" and r["block_size"] == 16
        assert 0 < r["fraction_of_roofline"] <= 1
    vec, pb = sorted(rows, key=lambda r: r["variant"] != "vectorized")
    assert vec["dma_bytes"] == pb["dma_bytes"] and vec["descriptors"] == pb["descriptors"]
    assert pb["dma_instructions"] > 10 * vec["dma_instructions"]
    assert pb["modeled_us"] > vec["modeled_us"]
    text = capsys.readouterr().out
    assert "MODELED" in text and "| decode |" in text


def test_workloads_have_the_documented_sizes(load_script):
    bench = load_script("bench_paged_attention")
    full = {w.name: w for w in bench.make_workloads(quick=False)}
    dec = full["decode"]
    assert len(dec.query_lens) == 64 and set(dec.query_lens) == {1}
    assert 2048 <= min(dec.context_lens) and max(dec.context_lens) <= 8192
    mix = full["mixed"]
    assert sum(q > 1 for q in mix.query_lens) == 4 and sum(q == 1 for q in mix.query_lens) == 12
    assert set(full) == {"decode", "mixed", "prefill"}
    assert bench.make_workloads(quick=False) == bench.make_workloads(quick=False)   # seeded


def test_progress_bar_renders_and_validates(load_script):
    prog = load_script("_progress")
    buf = io.StringIO()
    with prog.Progress(4, label="x", width=8, stream=buf, enabled=True) as bar:
        bar.advance(note="a")
        bar.advance(2)
        assert "[######--] 3/4" in bar.render()
    assert buf.getvalue().endswith("\n")
    quiet = io.StringIO()
    with prog.Progress(2, stream=quiet) as bar:   # not a tty -> disabled
        bar.advance()
    assert quiet.getvalue() == ""
    with pytest.raises(ValueError, match="total must be >= 0; got -1"):
        prog.Progress(-1)
