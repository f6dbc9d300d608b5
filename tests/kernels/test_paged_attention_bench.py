"""scripts/bench_paged_attention.py and its helpers (scripts/_pa_*.py, reached through the
script's ``workloads`` / ``runs`` / ``report`` attributes; scripts/_progress.py).

These check the benchmark's accounting and plumbing on tiny shapes (fast), never performance:
useful work is recounted by brute force, the per-engine breakdown must add up to the cost
model's engine totals, a tiny batch runs through all three kernels and matches the float64
reference, and the report / CLI paths work from a JSON document.
"""
from __future__ import annotations

import io
import json
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.simulation
TINY = dict(heads=4, kv_heads=2, head_size=32)


def _brute_force_work(q_lens, c_lens, H, Hkv, d, itemsize):
    """Useful bytes and FLOPs by enumerating tokens and (query, key) pairs one by one."""
    nbytes = flops = 0
    for q, c in zip(q_lens, c_lens):
        for _ in range(c):                              # cached token: K and V, every KV head
            nbytes += 2 * Hkv * d * itemsize
        for j in range(q):                              # new token: q, k, v in; output out
            nbytes += (H + 2 * Hkv) * d * itemsize + H * d * itemsize
            for key in range(c + q):
                if key <= c + j:                        # causal, same sequence
                    flops += H * (2 * d + 2 * d)       # QK^T and PV multiply-adds
    return nbytes, flops


@pytest.mark.parametrize("q_lens, c_lens", [((1, 1, 1), (5, 0, 17)), ((7, 1), (3, 40)), ((9,), (0,))])
def test_useful_work_matches_brute_force(q_lens, c_lens, load_script):
    wl = load_script("bench_paged_attention").workloads
    w = wl.Workload("t", "mixed", q_lens, c_lens)
    got = wl.useful_work(w, heads=6, kv_heads=3, head_size=8, itemsize=2)
    assert (got["bytes"], got["flops"]) == _brute_force_work(q_lens, c_lens, 6, 3, 8, 2)


def test_useful_roofline_uses_the_core_bandwidth_and_tensor_peak(load_script):
    wl = load_script("bench_paged_attention").workloads
    from nki_sim.cost import get_constants
    assert wl.roofline_bandwidth(get_constants("trn1")) == 272.0     # 16 x 17 B/ns < 410
    assert wl.roofline_bandwidth(get_constants("trn2")) == 362.5     # HBM share < 16 x 23
    mem = wl.useful_roofline_us({"bytes": 362_500, "flops": 0}, "trn2")
    assert mem["us"] == pytest.approx(1.0) and mem["bound"] == "memory"
    comp = wl.useful_roofline_us({"bytes": 0, "flops": 78_643_200}, "trn2")   # 1 us at peak
    assert comp["us"] == pytest.approx(1.0) and comp["bound"] == "compute"


def test_workloads_cover_the_serving_batches(load_script):
    wl = load_script("bench_paged_attention").workloads
    full = {w.name: w for w in wl.make_workloads(quick=False)}
    assert full == {w.name: w for w in wl.make_workloads(quick=False)}       # seeded
    for n in (32, 64, 128, 256):
        w = full[f"decode_{n}"]
        assert w.num_seqs == n and set(w.query_lens) == {1}
        assert 2048 <= min(w.context_lens) and max(w.context_lens) <= 8192
        # the same context distribution repeated: useful work scales exactly with the batch
        assert wl.useful_work(w)["bytes"] == pytest.approx(
            n // 32 * wl.useful_work(full["decode_32"])["bytes"], rel=1e-3)
    mix = full["mixed_2x+30"]
    assert mix.query_lens[:2] == (384, 256) and mix.query_lens[2:] == (1,) * 30
    assert full["mixed_4x512+60"].query_lens == (512,) * 4 + (1,) * 60
    assert (full["prefill_2k_on_2k"].query_lens, full["prefill_2k_on_2k"].context_lens) == ((2048,), (2048,))
    assert (full["prefill_1k_on_0"].query_lens, full["prefill_1k_on_0"].context_lens) == ((1024,), (0,))
    with pytest.raises(ValueError, match="num_seqs must be a multiple of len"):
        wl.decode_workload(33, (2048,) * 32)


def test_full_plan_runs_scheduled_everywhere_and_says_what_it_skips(load_script):
    bench = load_script("bench_paged_attention")
    wls = bench.make_workloads(quick=False)
    jobs, skipped = bench.sweep_plan(wls, ["trn1", "trn2"], list(bench.KERNELS), quick=False)
    sched = {(w.name, t) for w, b, k, t in jobs if k == "scheduled" and b == bench.BLOCK}
    for w in wls:
        assert (w.name, "trn2") in sched
        assert (w.name, "trn1") in sched or w.name in bench.TRN2_ONLY
    dense = {w.name for w, _, k, _ in jobs if k == "dense"}
    skipped_dense = {s["workload"] for s in skipped if s["kernel"] == "dense"}
    assert dense and skipped_dense and dense.isdisjoint(skipped_dense)
    assert dense | skipped_dense == {w.name for w in wls}
    assert all("score blocks" in s["reason"] for s in skipped if s["kernel"] != "all")
    # within a (workload, block, target) the scheduled kernel runs first (outputs compared)
    for i, (w, b, k, t) in enumerate(jobs):
        if k != "scheduled":
            assert any(j[:2] == (w, b) and j[2] == "scheduled" and j[3] == t for j in jobs[:i])


_TINY: list = []


@pytest.fixture
def tiny_rows(load_script):
    """A 3-sequence decode batch and a mixed one through all three kernels on trn2 (simulated
    once per session)."""
    if not _TINY:
        wl, runs = load_script("bench_paged_attention").workloads, load_script("bench_paged_attention").runs
        for w in (wl.Workload("tiny_decode", "decode", (1, 1, 1), (100, 40, 300)),
                  wl.Workload("tiny_mixed", "mixed", (20, 1), (37, 90))):
            batch = wl.make_batch(w, 16, **TINY)
            for k in runs.KERNELS:
                o, trace, sec, meta = runs.simulate(k, batch, "trn2")
                _TINY.append((w, batch, k, o, trace,
                              runs.make_row(w, 16, "trn2", k, trace, sec, meta, TINY)))
    return _TINY


def test_tiny_batches_match_the_reference_and_rows_are_consistent(tiny_rows, tol):
    from host.reference import paged_attention_ref
    atol, rtol = tol("mixed", "bfloat16")
    for w, batch, k, o, trace, row in tiny_rows:
        ref = paged_attention_ref(*(batch[n] for n in ("query", "key", "value", "kv_cache",
                                                       "block_tables", "query_lens", "context_lens")))
        assert np.all(np.abs(np.asarray(o, np.float64) - ref) <= atol + rtol * np.abs(ref)), (w.name, k)
        assert 0 < row["efficiency"] <= 1, row
        assert row["efficiency"] == pytest.approx(row["useful_roofline_us"] / row["modeled_us"])
        assert row["bytes_ratio"] >= 1 and row["flops_ratio"] >= 1          # never below useful
        assert row["dma_instructions"] == sum(e.engine == "dma" for e in trace.events)


def test_mask_bytes_are_the_host_arrays(tiny_rows, load_script):
    from host.scheduled.schedule import make_schedule
    rows = {(w.name, k): row for w, _, k, _, _, row in tiny_rows}
    # dense: 3 tokens (6 packed rows) -> Qpad 128; 29 blocks of 16 -> one 2048-token tile
    assert rows[("tiny_decode", "dense")]["mask_bytes"] == 128 * (2048 + 128)
    assert rows[("tiny_decode", "per_block")]["mask_bytes"] == 128 * (2048 + 128)
    for w, batch, k, _, _, row in tiny_rows:
        if k != "scheduled":
            continue
        # the spy saw the schedule the host launched: the same float arrays as a fresh one
        s = make_schedule(w.query_lens, w.context_lens, batch["block_tables"], num_heads=4,
                          num_kv_heads=2, head_size=32, block_size=16,
                          num_blocks=batch["kv_cache"].shape[1], query_itemsize=2,
                          cache_itemsize=2, kernel_itemsize=2)
        phases = [p for c in s.classes for p in (c.partial, c.full)]
        expect = sum(p.meta_f.nbytes + (0 if p.bounds is None else p.bounds.nbytes) for p in phases)
        assert row["mask_bytes"] == expect > 0
        assert row["index_bytes"] == sum(p.meta_i.nbytes for p in phases)
        # O(query rows), not O(queries x context)
        assert row["mask_bytes"] < rows[(w.name, "dense")]["mask_bytes"] / 10
    runs = load_script("bench_paged_attention").runs
    with pytest.raises(RuntimeError, match="no schedule captured"):
        runs.scheduled_metadata([])


def test_breakdown_adds_up_to_the_engine_totals(tiny_rows, load_script):
    runs = load_script("bench_paged_attention").runs
    from nki_sim import cost
    for _, _, k, _, trace, _ in tiny_rows[:3]:
        bd = runs.breakdown(trace, "trn2", top=10_000)
        rep = cost.estimate(trace, "trn2")
        for eng in ("tensor", "vector", "scalar", "gpsimd"):
            assert sum(us for _, us, _ in bd[eng]["kinds"]) == pytest.approx(rep.per_engine_us[eng])
        mean_share = sum(us for _, us, _ in bd["dma"]["kinds"])
        assert mean_share <= bd["dma"]["engine_max_us"] * (1 + 1e-9) <= rep.per_engine_us["dma"] * (1 + 1e-9)
        assert sum(n for _, _, n in bd["dma"]["kinds"]) == rep.dma_instructions
        short = runs.breakdown(trace, "trn2", top=2)
        assert all(len(short[e]["kinds"]) <= 2 for e in cost.ENGINES)


def _doc(rows, breakdowns=None):
    return dict(commit="abc1234", heads=dict(H=4, Hkv=2, d=32), wall_seconds=1.0, rows=rows,
                skipped=[dict(workload="x", kernel="dense", targets=["trn2"], reason="budget")],
                breakdowns=breakdowns or {}, command="test")


def _decode_row(n, us):
    return dict(workload=f"decode_{n}", kind="decode", target="trn2", kernel="scheduled",
                block_size=32, num_seqs=n, query_tokens=n, context_tokens=1000 * n,
                modeled_us=us, useful_roofline_us=n, useful_bound="memory", efficiency=n / us,
                bytes_ratio=1.0, flops_ratio=1.0, mask_bytes=1024, dma_instructions=1,
                dma_indirect_instructions=1, per_engine_us=dict.fromkeys(
                    ("tensor", "vector", "scalar", "gpsimd", "dma"), 1.0), bottleneck="dma",
                cost_model_fraction_of_roofline=0.5, sim_seconds=0.1, meta={})


@pytest.mark.parametrize("x4_time, verdict", [(420.0, "4.20x holds"), (460.0, "4.60x MISSED")])
def test_scaling_verdict_can_pass_and_fail(x4_time, verdict, load_script):
    rep = load_script("bench_paged_attention").report
    rows = [_decode_row(32, 100.0), _decode_row(64, 210.0), _decode_row(128, x4_time)]
    text = rep.scaling_table(rows)
    assert verdict in text and "2.10x" in text


def test_report_from_json_and_markdown_file(tmp_path, tiny_rows, capsys, load_script):
    bench = load_script("bench_paged_attention")
    runs = load_script("bench_paged_attention").runs
    rows = [r for *_, r in tiny_rows]
    bds = {"tiny_mixed|scheduled|trn2": runs.breakdown(tiny_rows[3][4], "trn2")}
    src, md = tmp_path / "in.json", tmp_path / "report.txt"
    src.write_text(json.dumps(_doc(rows, breakdowns=bds)))
    assert bench.main(["--table-from", str(src), "--markdown", str(md), "--breakdown"]) == 0
    text = md.read_text()
    for needle in ("MODELED", "| tiny_decode |", "dense (GQA-packed)", "Where the time goes",
                   "counts waste", "## Skipped", "x / dense on trn2: budget"):
        assert needle in text, needle
    assert "Where the time goes: tiny_mixed, scheduled, trn2" in capsys.readouterr().out


def test_plot_fails_before_the_sweep_without_matplotlib(monkeypatch, load_script):
    bench = load_script("bench_paged_attention")
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setattr(bench, "run_sweep", lambda *a, **k: pytest.fail("sweep ran"))
    with pytest.raises(SystemExit, match="--plot needs matplotlib"):
        bench.main(["--quick", "--plot", "x.png"])


def test_plot_writes_a_png(tmp_path, load_script):
    pytest.importorskip("matplotlib", reason="the bench extra (matplotlib) is not installed")
    rep = load_script("bench_paged_attention").report
    rows = [_decode_row(32, 100.0), _decode_row(64, 210.0)]
    rows.append(dict(_decode_row(32, 150.0), kernel="dense", meta={"gqa_packing": True}))
    path = tmp_path / "p.png"
    rep.plot(_doc(rows), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


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


def test_api_axis_expands_the_scheduled_jobs_only(load_script):
    """--api both: the scheduled kernel on legacy everywhere and on nki on trn2, each at its
    LNCs; the dense kernels stay legacy at LNC 1."""
    bench = load_script("bench_paged_attention")
    w = bench.make_workloads(quick=True)[0]
    jobs = [(w, bench.BLOCK, "scheduled", "trn1"), (w, bench.BLOCK, "scheduled", "trn2"),
            (w, bench.BLOCK, "dense", "trn2")]
    got = [(k, t, a, n) for _, _, k, t, a, n in bench.expand_lnc(jobs, [1, 2], "both")]
    assert got == [("scheduled", "trn1", "legacy", 1),
                   ("scheduled", "trn2", "legacy", 1), ("scheduled", "trn2", "legacy", 2),
                   ("scheduled", "trn2", "nki", 1), ("scheduled", "trn2", "nki", 2),
                   ("dense", "trn2", "legacy", 1)]
    auto = [(t, a) for _, _, k, t, a, n in bench.expand_lnc(jobs[:2], [1], "auto")]
    assert auto == [("trn1", "legacy"), ("trn2", "nki")]


def test_rows_of_the_non_default_api_are_labelled(tiny_rows, load_script):
    runs = load_script("bench_paged_attention").runs
    w, _, k, _, trace, row = next(x for x in tiny_rows if x[2] == "scheduled")
    assert row["target"] == "trn2" and row["api"] is None
    labels = {api: runs.make_row(w, 16, "trn2", "scheduled", trace, 0.0, row["meta"] | {
        "mask_bytes": 0, "index_bytes": 0}, TINY, api=api, lnc=lnc)["target"]
        for api, lnc in (("nki", 1), ("legacy", 2))}
    assert labels == {"nki": "trn2", "legacy": "trn2-lnc2-legacy"}
    dense = runs.make_row(w, 16, "trn2", "dense", trace, 0.0, {"mask_bytes": 0, "index_bytes": 0},
                          TINY, api="legacy")
    assert dense["target"] == "trn2"


def test_report_from_two_processes_merges_their_rows(tmp_path, tiny_rows, capsys, load_script):
    """--table-from a.json b.json: the processes of one sweep (split by target) give one report,
    rows back in workload order; documents of different commits are refused (exit 2)."""
    bench = load_script("bench_paged_attention")
    rows = [r for *_, r in tiny_rows if r["kernel"] == "scheduled"]
    trn1 = [dict(r, target="trn1") for r in rows]
    a, b, md = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "report.txt"
    a.write_text(json.dumps(_doc(trn1) | {"cpu_seconds": 60.0, "command": "run a"}))
    b.write_text(json.dumps(_doc(rows) | {"cpu_seconds": 120.0, "wall_seconds": 90.0,
                                          "command": "run b"}))
    assert bench.main(["--table-from", str(a), str(b), "--markdown", str(md)]) == 0
    text = md.read_text()
    assert "CPU time 3.0 min (2 single-threaded processes side by side, merged" in text
    assert "wall time 1.5 min" in text and "`run a & run b, then python scripts/bench_paged_" \
        f"attention.py --table-from {a} {b} --markdown {md}`" in text
    order = [(line.split("|")[1].strip(), line.split("|")[3].strip())
             for line in text.split("## All rows")[1].splitlines() if line.startswith("| tiny")]
    assert order == [("tiny_decode", "trn1"), ("tiny_decode", "trn2"),
                     ("tiny_mixed", "trn1"), ("tiny_mixed", "trn2")]
    b.write_text(json.dumps(_doc(rows) | {"commit": "fffffff"}))
    with pytest.raises(SystemExit) as e:
        bench.main(["--table-from", str(a), str(b)])
    assert e.value.code == 2 and "has commit 'fffffff'" in capsys.readouterr().err


def test_a_one_target_plan_skips_nothing_on_no_target(load_script):
    """--targets trn1: the trn2-only workload is skipped once ('all'), not once per kernel too."""
    bench = load_script("bench_paged_attention")
    wls = bench.make_workloads(quick=False)
    jobs, skipped = bench.sweep_plan(wls, ["trn1"], list(bench.KERNELS), quick=False)
    assert all(s["targets"] for s in skipped)
    assert [s["kernel"] for s in skipped if s["workload"] in bench.TRN2_ONLY] == ["all"]
    assert not any(w.name in bench.TRN2_ONLY for w, *_ in jobs)
