"""scripts/bench_mla.py: the quick run's JSON and table (one target, one head count, so it stays
around a second) and its argument checks before anything runs."""
from __future__ import annotations

import json

import pytest


@pytest.mark.simulation
def test_quick_run_rows_and_alignment_columns(load_script, tmp_path, capsys):
    js, md = tmp_path / "mla.json", tmp_path / "table.txt"
    argv = ["--quick", "--targets", "trn2", "--heads", "16", "--no-progress", "--json", str(js),
            "--markdown", str(md)]
    assert load_script("bench_mla").main(argv) == 0
    doc = json.loads(js.read_text())
    assert doc["script"] == "bench_mla.py" and doc["quick"] is True
    unaligned, aligned = sorted(doc["rows"], key=lambda r: r["entry_size"])
    assert (unaligned["entry_size"], aligned["entry_size"]) == (576, 640)
    # Same instructions and descriptors; each gathered entry moves 640 instead of 576 elements.
    assert unaligned["dma_instructions"] == aligned["dma_instructions"]
    assert unaligned["descriptors"] == aligned["descriptors"]
    kv_entries = unaligned["context_tokens"]
    assert aligned["dma_bytes"] - unaligned["dma_bytes"] == kv_entries * (640 - 576) * 2
    assert aligned["entrywise_descriptors"] > aligned["descriptors"]
    for r in doc["rows"]:
        assert 0 < r["efficiency"] <= 1 and r["modeled_us"] > r["useful_roofline_us"]
    out = capsys.readouterr().out
    assert "MODELED" in out and doc["summary"] in out
    assert md.read_text().startswith("MODELED") and "| trn2 | nki |" in md.read_text()
    assert {r["api"] for r in doc["rows"]} == {"nki"}        # --api auto: trn2 runs the current API
    assert doc["command"].startswith("python scripts/bench_mla.py --quick") and doc["commit"]


@pytest.mark.simulation
def test_quick_run_on_both_apis(load_script, tmp_path):
    """--api both on trn2: the same workload on each API; same DMA work, same output checks."""
    js = tmp_path / "mla.json"
    argv = ["--quick", "--targets", "trn2", "--heads", "16", "--api", "both", "--no-progress",
            "--json", str(js)]
    assert load_script("bench_mla").main(argv) == 0
    rows = json.loads(js.read_text())["rows"]
    by = {(r["api"], r["entry_size"]): r for r in rows}
    assert set(by) == {(a, e) for a in ("legacy", "nki") for e in (576, 640)}
    for e in (576, 640):
        assert by[("legacy", e)]["dma_bytes"] == by[("nki", e)]["dma_bytes"]
        assert by[("legacy", e)]["modeled_us"] > 0 and by[("nki", e)]["modeled_us"] > 0


@pytest.mark.parametrize("bad, message", [
    (["--json", "{tmp}/missing/x.json"], "--json folder must exist"),
    (["--markdown", "{tmp}/missing/table.txt"], "--markdown folder must exist"),
    (["--heads", "32"], "invalid choice"),
    (["--api", "nki"], "--api nki: the current NKI API is modeled on trn2 only"),
    (["--api", "current"], "invalid choice"),
])
def test_bad_arguments_exit_2_before_the_run(bad, message, load_script, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        load_script("bench_mla").main(["--quick", *[b.format(tmp=tmp_path) for b in bad]])
    assert e.value.code == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.out == ""
