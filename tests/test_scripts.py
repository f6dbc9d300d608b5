"""scripts/: the shared --quick / --json / --plot conventions (nki_pa_cli.script_args), each
script's argument validation, and the quick mode of the scripts whose quick run takes about a
second (bench_gqa_packing's takes several: validation only; bench_cache_write's quick run is in
tests/kernels/cache/test_cache_ops_bench.py; bench_paged_attention has its own tests)."""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import pytest

from nki_pa_cli import script_args

OWN = ("bench_block_copy", "bench_cache_write", "bench_floors", "bench_gqa_packing",
       "bench_host_prep",
       "bench_kv_dma_modes", "bench_kv_layout", "bench_lnc_parts", "bench_masked_weight",
       "bench_prefill_choices", "bench_schedule_whatif", "bench_sim_speed", "bench_variants",
       "profile_call_sites", "time_flash_sim")


@pytest.fixture
def run_quick(load_script, tmp_path):
    """Run a script with --quick --json; returns the JSON object after checking its envelope."""
    def run(name, *extra):
        out = tmp_path / f"{name}.json"
        assert load_script(name).main(["--quick", "--json", str(out), *extra]) == 0
        doc = json.loads(out.read_text())
        assert doc["script"] == f"{name}.py" and doc["quick"] is True and doc["rows"]
        return doc
    return run


@pytest.mark.parametrize("name", OWN)
def test_json_folder_is_checked_before_the_run(name, tmp_path, capsys, load_script):
    with pytest.raises(SystemExit) as e:
        load_script(name).main(["--quick", "--json", str(tmp_path / "missing" / "x.json")])
    assert e.value.code == 2
    assert "--json folder must exist" in capsys.readouterr().err


@pytest.mark.parametrize("name, bad", [
    ("bench_block_copy", ["--blocks", "5"]), ("bench_block_copy", ["--layers", "0"]),
    ("bench_cache_write", ["--repeats", "0"]), ("bench_gqa_packing", ["--bogus"]),
    ("bench_host_prep", ["--decode", "0", "--prefill", "0"]), ("bench_host_prep", ["--tile", "0"]),
    ("bench_sim_speed", ["--iters", "0"]), ("time_flash_sim", ["--ctx", "100"]),
    ("time_flash_sim", ["--workload", "prefill"]),
    ("bench_variants", ["--markdown", "no-such-folder/page"]),
    ("bench_variants", ["--api", "nki"]), ("bench_variants", ["--api", "nki", "--targets", "trn1"]),
    ("bench_mla", ["--api", "nki"]), ("bench_paged_attention", ["--api", "nki"]),
    ("bench_block_copy", ["--api", "current"]), ("bench_cache_write", ["--api", "current"]),
    ("bench_kv_layout", ["--api", "nki"]), ("bench_kv_layout", ["--targets", "trn3"]),
    ("bench_schedule_whatif", ["--targets", "trn3"]),
    ("bench_floors", ["--targets", "trn3"]), ("bench_floors", ["--markdown", "no-such-folder/page"]),
    ("bench_schedule_whatif", ["--markdown", "no-such-folder/page"]),
    ("bench_evidence", ["--markdown", "no-such-folder/page"]),
    ("bench_kv_dma_modes", ["--markdown", "no-such-folder/page"]),
    ("bench_lnc_parts", ["--markdown", "no-such-folder/page"]),
    ("bench_masked_weight", ["--markdown", "no-such-folder/page"]),
    ("bench_prefill_choices", ["--markdown", "no-such-folder/page"]),
    ("profile_call_sites", ["--top", "0"]), ("profile_call_sites", ["decode_8:trn3"]),
    ("profile_call_sites", ["decode_8"])])
def test_bad_arguments_exit_2_before_the_run(name, bad, capsys, load_script):
    with pytest.raises(SystemExit) as e:
        load_script(name).main(["--quick", *bad])
    assert e.value.code == 2
    assert capsys.readouterr().out == ""          # nothing ran, nothing printed


@pytest.mark.parametrize("name", ["bench_variants", "bench_mla", "bench_paged_attention",
                                  "bench_kv_layout"])
def test_api_nki_on_trn1_is_an_argparse_error_naming_what_to_pass(name, capsys, load_script):
    with pytest.raises(SystemExit) as e:
        load_script(name).main(["--quick", "--api", "nki", "--targets", "trn1", "trn2"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--api nki" in err and "trn2 only" in err and "['trn1']" in err and "--targets trn2" in err


def test_recorded_command_names_repo_relative_paths(tmp_path):
    # a generated page records its command: an absolute path inside the checkout becomes
    # repo-relative; one outside it, and relative paths, stay as given
    from pathlib import Path

    root = Path(script_args.__file__).resolve().parents[1]
    cmd = script_args.command_line("bench_x.py", ["--markdown", str(root / "docs" / "b.txt"),
                                                  "--json", "out/b.json", str(tmp_path / "c")])
    assert cmd == f"python scripts/bench_x.py --markdown docs/b.txt --json out/b.json {tmp_path / 'c'}"


def test_api_runs_per_target():
    runs = script_args.api_runs
    assert runs("auto", ["trn1", "trn2"]) == [("trn1", "legacy"), ("trn2", "nki")]
    assert runs("both", ["trn1", "trn2"]) == [("trn1", "legacy"), ("trn2", "legacy"), ("trn2", "nki")]
    assert runs("legacy", ["trn2"]) == [("trn2", "legacy")]
    assert runs("nki", ["trn2"]) == [("trn2", "nki")]
    with pytest.raises(ValueError, match="api must be one of"):
        runs("current", ["trn2"])
    ap = argparse.ArgumentParser(prog="toy")
    script_args.add_api_arg(ap, default="both")
    assert ap.parse_args([]).api == "both" and ap.parse_args(["--api", "auto"]).api == "auto"
    script_args.check_api_targets(ap, "nki", ["trn2"])          # accepted: nothing raised
    script_args.check_api_targets(ap, "both", ["trn1", "trn2"])


def _toy_parser():
    ap = argparse.ArgumentParser(prog="toy")
    script_args.add_common_args(ap, quick_help="q", plot_help="a plot")
    return ap


def test_plot_without_matplotlib_fails_at_parse_time(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)         # import matplotlib -> ImportError
    with pytest.raises(SystemExit) as e:
        script_args.parse_args(_toy_parser(), ["--plot", str(tmp_path / "p.png")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "matplotlib is not installed" in err and "drop --plot" in err


def test_plot_and_json_accepted_when_possible(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="the bench extra (matplotlib) is not installed")
    args = script_args.parse_args(_toy_parser(), ["--quick", "--json", str(tmp_path / "r.json"),
                                                  "--plot", str(tmp_path / "p.png")])
    script_args.write_json(args, "toy.py", [{"a": 1}], extra=2)
    assert json.loads((tmp_path / "r.json").read_text()) == {
        "script": "toy.py", "quick": True, "rows": [{"a": 1}], "extra": 2}
    assert f"json: {tmp_path / 'r.json'}" in capsys.readouterr().out


@pytest.mark.simulation
def test_bench_block_copy_quick(run_quick, capsys):
    rows = run_quick("bench_block_copy")["rows"]          # default --api both
    assert "| coalesced | nki |" in capsys.readouterr().out
    for g in {r["groups"] for r in rows}:
        group = {(r["variant"], r["api"]): r for r in rows if r["groups"] == g}
        assert set(group) == {("per-block", "legacy"), ("per-group", "legacy"),
                              ("coalesced per layer", "legacy"), ("coalesced per layer", "nki"),
                              ("coalesced", "legacy"), ("coalesced", "nki")}
        assert len({r["kv_bytes"] for r in group.values()}) == 1
        assert group[("coalesced", "nki")]["gather_scatter_dmas"] == min(
            r["gather_scatter_dmas"] for r in group.values())
        for (variant, api), r in group.items():     # the current API: no trn1 figure
            assert (r["modeled_us_trn1"] is None) == (api == "nki") and r["modeled_us_trn2"] > 0


@pytest.mark.simulation
def test_bench_block_copy_one_api(run_quick):
    rows = run_quick("bench_block_copy", "--api", "legacy")["rows"]
    assert {r["api"] for r in rows} == {"legacy"}


def test_bench_host_prep_quick(run_quick, capsys):
    doc = run_quick("bench_host_prep")
    mixed, decode = doc["rows"]
    assert mixed["num_seqs"] == decode["num_seqs"] == 32
    assert decode["num_queries"] == 32 and mixed["num_queries"] == 28 + 4 * 64
    for r in doc["rows"]:
        Q, ctx = r["padded_queries"], r["context_kv_len"]
        assert Q % 128 == 0 and Q >= r["num_queries"]
        assert r["bytes"]["dense_mask"] == Q * (ctx + Q)
    assert "measured wall-clock" in capsys.readouterr().out


@pytest.mark.simulation
def test_bench_sim_speed_quick_counts_every_instruction(run_quick, capsys):
    untraced, traced = run_quick("bench_sim_speed")["rows"]
    assert traced["traced"] and not untraced["traced"]
    assert traced["instructions"] == untraced["instructions"] == 4 * 250 + 4


@pytest.mark.simulation
def test_time_flash_sim_quick(run_quick, capsys, tol):
    doc = run_quick("time_flash_sim")
    (row,) = doc["rows"]
    assert (doc["sequences"], doc["ctx"], row["workload"]) == (4, 512, "decode")
    assert row["max_abs_err"] <= tol("mixed", np.float32)[0]
    assert row["dma_indirect_instructions"] > 0 and row["modeled_us"] > 0
    assert "MODELED" in capsys.readouterr().out


@pytest.mark.simulation
def test_time_flash_sim_compare_api_quick(run_quick, capsys):
    # the dense kernel on both APIs on trn2 (the script asserts the outputs agree to 1e-6);
    # the current API transposes a step's P blocks with one DMA (fewer DMA instructions)
    # and on two cores (LNC 2) each core runs half of the KV heads
    doc = run_quick("time_flash_sim", "--compare-api")
    legacy, current, two = doc["rows"]
    assert [(r["api"], r["lnc"]) for r in doc["rows"]] == [("legacy", 1), ("nki", 1), ("nki", 2)]
    assert doc["times"] == "MODELED"
    assert current["dma_instructions"] < legacy["dma_instructions"]
    assert 0 < current["modeled_us"] < legacy["modeled_us"]
    assert 0.45 * current["modeled_us"] < two["modeled_us"] < 0.55 * current["modeled_us"]
    assert "MODELED trn2, dense kernel" in capsys.readouterr().out


def test_bench_variants_useful_roofline(load_script):
    """Useful bytes: the visible cached K/V once per KV head (a window of W sees W - 1 cached
    tokens besides the new one) + q, k, v, out once in bf16; BW = min(HBM per core, 16 DMA
    engines x practical bandwidth)."""
    m = load_script("bench_variants")
    win = m.Workload("w", 32768, "w", ("window", "fp8"), window=4096)
    plain = m.Workload("p", 4096, "p")
    io = 32 * (32 + 8 + 8 + 32) * 128 * 2
    assert m.useful_bytes(win, 32, 32, 8, cache_itemsize=1) == 2 * 32 * 4095 * 8 * 128 + io
    assert m.useful_bytes(plain, 32, 32, 8, cache_itemsize=2) == 2 * 32 * 4096 * 8 * 128 * 2 + io
    assert m.useful_bandwidth("trn1") == 272.0 and m.useful_bandwidth("trn2") == 362.5


def test_bench_variants_rows_per_target_and_api(load_script, monkeypatch):
    """Each (target, api) run divides by its own baseline row and gets its own findings line."""
    m = load_script("bench_variants")
    t = {"legacy": 100.0, "nki": 80.0}

    def fake_run(w, target, S, H, Hkv, api):
        us = t[api] * (2.0 if w.context > 4096 else 1.0) * (1.5 if w.options else 1.0)
        return dict(workload=w.name, baseline=w.baseline, target=target, api=api, modeled_us=us,
                    kv_bytes=us, sim_wall_s=0.0)

    monkeypatch.setattr(m, "run", fake_run)
    rows = m.bench(True, [("trn2", "legacy"), ("trn2", "nki")])
    assert {(r["target"], r["api"]) for r in rows} == {("trn2", "legacy"), ("trn2", "nki")}
    plain32 = {r["api"]: r["vs_baseline"] for r in rows if r["workload"] == "plain 32K"}
    assert plain32 == {"legacy": 2.0, "nki": 2.0}
    text = m.findings(rows)
    assert "**trn2, legacy API**" in text and "**trn2, nki API**" in text


def test_bench_api_parity_pairs_the_apis_of_each_benchmark(load_script, tmp_path, capsys):
    m = load_script("bench_api_parity")
    pa = {"command": "python scripts/bench_paged_attention.py --api both", "rows": [
        dict(workload="d", block_size=32, kernel="scheduled", target=t, api=a, lnc=n, modeled_us=us)
        for t, a, n, us in (("trn2", "nki", 1, 75.0), ("trn2-legacy", "legacy", 1, 100.0),
                            ("trn2-lnc2", "nki", 2, 40.0), ("trn2-lnc2-legacy", "legacy", 2, 50.0),
                            ("trn1", "legacy", 1, 90.0))] + [
        dict(workload="d", block_size=32, kernel="dense", target="trn2", api="legacy", lnc=1,
             modeled_us=300.0)]}
    mla = {"script": "bench_mla.py", "rows": [
        dict(workload="m", H=16, entry_size=576, target="trn2", api=a, modeled_us=us)
        for a, us in (("legacy", 10.0), ("nki", 11.0))] + [
        dict(workload="m", H=16, entry_size=640, target="trn2", api="nki", modeled_us=9.0)]}
    files = []
    for name, doc in (("pa", pa), ("mla", mla)):
        files.append(tmp_path / f"{name}.json")
        files[-1].write_text(json.dumps(doc))
    md = tmp_path / "parity.txt"
    assert m.main([*map(str, files), "--markdown", str(md)]) == 0
    text = md.read_text()
    assert "| paged attention (scheduled) | d, B=32 | 100.0 | 75.0 | 0.750 |" in text
    assert "| paged attention (scheduled) | d, B=32, LNC 2 | 50.0 | 40.0 | 0.800 |" in text
    assert "| MLA decode | m, H=16, entry 576 | 10.0 | 11.0 | 1.100 |" in text
    assert "0.750 - 1.100; the current API is slower on 1 of them. (1 row(s) ran on one API" in text
    assert "dense" not in text and "trn1" not in text
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"script": "bench_host_prep.py", "rows": []}))
    with pytest.raises(SystemExit) as e:
        m.main([str(bad)])
    assert e.value.code == 2 and "not the JSON of a benchmark with an --api axis" in \
        capsys.readouterr().err


# ------------------------------------------------------------------------- bench_schedule_whatif
def test_schedule_whatif_variants_swap_the_schedule_and_restore_it(load_script):
    import host.scheduled.schedule as sched
    import host.scheduled.schedule_items as items
    from host.scheduled.schedule import make_schedule
    mod = load_script("bench_schedule_whatif")
    shipped = (sched.bucket, items.bucket, items.fill_partial_padding, sched._class_schedule)
    full, part = [(0, 0), (1, 0)], [(0, 1), (1, 1), (2, 1), (3, 1), (4, 1)]
    with mod.variant("no fill"):
        assert items.fill_partial_padding(full, part, 1) == (full, part)
    with mod.variant("unpadded"):
        assert (sched.bucket(13), items.bucket(13)) == (13, 13)
    with mod.variant("fori 8"):
        assert [sched.bucket(n) for n in (5, 8, 9, 13, 17)] == [5, 8, 16, 16, 24]

    def counts(q, c):
        bt = np.arange(80, dtype=np.int32).reshape(2, 40)
        s = make_schedule(q, c, bt, num_heads=4, num_kv_heads=2, head_size=8, block_size=16,
                          num_blocks=80, large_tile_size=512)
        return [(cls.kind, cls.full.real_items, cls.partial.real_items) for cls in s.classes]
    # a 40-token chunk on 600 cached tokens (G = 2: 80 rows, the prefill class) and a decode
    assert counts([40, 1], [600, 600]) == [("decode", 1, 1), ("prefill", 1, 1)]
    with mod.variant("one phase"):          # the prefill class only: its full tile is masked
        assert counts([40, 1], [600, 600]) == [("decode", 1, 1), ("prefill", 0, 2)]
    assert (sched.bucket, items.bucket, items.fill_partial_padding,
            sched._class_schedule) == shipped
    with pytest.raises(ValueError, match="variant must be one of"):
        with mod.variant("bogus"):
            pass
    assert sched._class_schedule is shipped[3]


# ------------------------------------------------------------------------- bench_kv_dma_modes
def test_kv_dma_modes_quick(run_quick, capsys):
    """Every mode brings the cache's rows (the script checks); a gather is one swdge DMA with
    GpSimd descriptor work, the scalar-offset modes are 128 / k hwdge DMAs without any."""
    rows = {r["mode"]: r for r in run_quick("bench_kv_dma_modes")["rows"]}
    assert list(rows) == ["gather", "per block", "runs of 16", "runs of 128"]
    assert [rows[m]["dma_instructions_per_load"] for m in rows] == [1, 128, 8, 1]
    assert rows["gather"]["gpsimd_us"] > 0
    assert all(rows[m]["gpsimd_us"] == 0 for m in ("per block", "runs of 16", "runs of 128"))
    assert rows["per block"]["dma_queue_us"] > rows["runs of 16"]["dma_queue_us"] > \
        rows["runs of 128"]["dma_queue_us"]
    assert "| per block | 1 | 128 |" in capsys.readouterr().out


def test_kv_dma_modes_runs_need_consecutive_block_ids(load_script, monkeypatch):
    """A run DMA reads k consecutive blocks from its first id: with ids that are not in runs it
    brings the wrong rows, and the script stops instead of modeling them."""
    mod = load_script("bench_kv_dma_modes")
    assert mod.measure("runs of 16", 1)["blocks_per_dma"] == 16
    monkeypatch.setattr(mod, "block_ids", lambda n, loads, seed: (
        np.random.default_rng(seed).permutation(n)[:loads * 128].astype(np.int32)))
    assert mod.measure("gather", 1)["dma_instructions_per_load"] == 1
    with pytest.raises(SystemExit, match="runs of 16: the loaded rows differ"):
        mod.measure("runs of 16", 1)


# ------------------------------------------------------------------------- bench_lnc_parts
def test_lnc_parts_quick(run_quick, capsys):
    """One KV head (the scheduled kernel at Hkv = 1, MLA's latent cache) on both APIs: both
    cores busy, LNC 2 faster than LNC 1 (MODELED; the script itself stops when an LNC 2 output
    leaves the tolerance of LNC 1's)."""
    doc = run_quick("bench_lnc_parts")
    assert (doc["heads"], doc["kv_heads"]) == (4, 1)
    rows = doc["rows"]
    assert {(r["kernel"], r["workload"], r["api"], r["lnc"]) for r in rows} == {
        (k, w, a, n) for k, w in (("scheduled", "decode_8"), ("scheduled", "mixed_1x128+6"),
                                  ("mla", "2 x 2K"))
        for a in ("nki", "legacy") for n in (1, 2)}
    for r in rows:
        assert len(r["per_core_us"]) == r["lnc"] and all(u > 0 for u in r["per_core_us"])
        if r["lnc"] == 2:
            assert r["vs_lnc1"] < 0.9 and r["max_abs_diff_vs_lnc1"] <= 3e-2
    assert "| scheduled | decode_8 | nki |" in capsys.readouterr().out



# --------------------------------------------------------------------- bench_masked_weight
def test_masked_weight_quick(run_quick, load_script, capsys):
    """Both weights on both targets; the weight is restored after each run (also on error)."""
    doc = run_quick("bench_masked_weight")
    import host.scheduled.schedule_items as items

    rows = doc["rows"]
    assert {(r["batch"], r["target"], r["api"]) for r in rows} == {
        (b, t, a) for b in ("256 on 0", "128 on 128, window 64")
        for t, a in (("trn2", "nki"), ("trn1", "legacy"))}
    for r in rows:
        assert r["unweighted"]["weight"] == 1.0
        assert r["shipped"]["weight"] == items.MASKED_KEY_WEIGHT
        assert r["ratio"] == r["shipped"]["modeled_us"] / r["unweighted"]["modeled_us"] > 0
    assert "| 256 on 0 | trn2 (nki) |" in capsys.readouterr().out
    with pytest.raises(RuntimeError):
        with load_script("bench_masked_weight").masked_key_weight(3.0):
            assert items.MASKED_KEY_WEIGHT == 3.0
            raise RuntimeError
    assert items.MASKED_KEY_WEIGHT != 3.0


# ------------------------------------------------------------------- bench_prefill_choices
def test_prefill_choices_quick(run_quick, load_script, capsys):
    """Each choice as shipped and its alternative, what each run did as the kernel did it (the
    reset: the select on trn1 and without a full phase, the DMA on trn2's legacy API beside a
    full phase, the select on its current API for 8-block groups; the P^T copies of a 2048-key
    masked-only launch: one in four on VectorE), and the patched values restored after each run
    (also on error)."""
    doc = run_quick("bench_prefill_choices")
    import nki_kernels.scheduled.scheduled_attention as sa
    import nki_kernels.scheduled.sched_item as si

    did = {(r["choice"], r["batch"], r["target"], r["api"]): (r["shipped"]["form"],
                                                            r["alternative"]["form"])
           for r in doc["rows"]}
    assert did == {
        ("state reset", "256 on 4K", "trn2", "nki"): ("select", "DMA"),
        ("state reset", "256 on 4K", "trn2", "legacy"): ("DMA", "select"),
        ("state reset", "256 on 4K", "trn1", "legacy"): ("select", "DMA"),
        ("state reset", "256 on 0", "trn2", "nki"): ("select", "DMA"),
        ("state reset", "256 on 0", "trn2", "legacy"): ("select", "DMA"),
        ("state reset", "256 on 0", "trn1", "legacy"): ("select", "DMA"),
        ("P^T copies", "512 on 1536", "trn2", "nki"): ("8 of 32 bf16 PSUM copies on VectorE",
                                                       "all 32 on ScalarE"),
        ("P^T copies", "512 on 1536", "trn2", "legacy"): (      # + 2 K^T copies
            "8 of 34 bf16 PSUM copies on VectorE", "all 34 on ScalarE")}
    for r in doc["rows"]:
        assert r["ratio"] == r["shipped"]["modeled_us"] / r["alternative"]["modeled_us"] > 0
        assert r["shape"][0]["full"] == (2 if r["batch"] == "256 on 4K" else 0)
    assert "| 256 on 4K | trn2 (legacy) | 8; 2 / 1; " in capsys.readouterr().out
    script = load_script("bench_prefill_choices")

    def now():
        return sa.reset_by_dma, si.P_EVAC_GEN3_MASKED_ONLY, si.P_EVAC_GEN3_MASKED_HEAVY

    shipped = now()
    for form in (script.reset_rule(lambda s: not s), script.p_copy_engines((), "scalar")):
        with pytest.raises(RuntimeError):
            with form:
                assert now() != shipped
                raise RuntimeError
        assert now() == shipped


# ------------------------------------------------------------------------- bench_floors
def test_floors_quick_lie_below_the_shipped_kernel_and_above_the_roofline(run_quick, capsys,
                                                                           load_script):
    """A floor is a lower bound of the design: the shipped kernel never models faster, and the
    floor holds at least the useful work (its efficiency is at most 1)."""
    rows = run_quick("bench_floors")["rows"]
    assert {(r["workload"], r["target"], r["api"]) for r in rows} == {
        (w, t, a) for w in ("decode_8", "mixed_1x128+6") for t, a in (("trn1", "legacy"),
                                                                      ("trn2", "nki"))}
    for r in rows:
        assert r["roofline_us"] <= r["floor_us"] < r["shipped_us"], r
        assert r["floor_efficiency"] == pytest.approx(r["roofline_us"] / r["floor_us"])
        assert 0.0 <= r["p_t_dma_share"] <= 1.0
    assert "| decode_8 | trn2 (nki) |" in capsys.readouterr().out
    page = load_script("bench_floors").markdown(rows, True, "cmd", "abc1234")
    got = [line for line in page.splitlines() if line.startswith("| decode_8 | trn2 |")]
    r = next(r for r in rows if (r["workload"], r["target"]) == ("decode_8", "trn2"))
    assert got == ["| decode_8 | trn2 | " + " | ".join(     # shipped us / floor us per resource
        f"{r['shipped_engines_us'][e]:.0f} / {r['floor_engines_us'][e]:.0f}"
        for e in ("tensor", "vector", "scalar", "gpsimd", "dma")) + " | 0 / 0 | "
        f"{r['shipped_ports_us']['vector+gpsimd']:.0f} / {r['floor_ports_us']['vector+gpsimd']:.0f} |"]


def test_floor_accounting_of_one_decode_and_of_prefill_blocks(load_script):
    mod = load_script("bench_floors")
    # 256 keys (255 cached + the new one), one KV head: two 128-key blocks, each an S^T and a
    # (P V)^T matmul at the 64-cycle minimum; trn1 adds a PE transpose per block (128 cycles)
    for target, k_by_dma, cycles, ghz in (("trn2", True, 4 * 64, 2.4),
                                          ("trn1", False, 4 * 64 + 2 * 128, 2.8)):
        fl = mod.Floor(target)
        fl.decode(255, 1, 128, k_by_dma)
        got = mod.modeled(fl, 128)
        assert got["per_engine_us"]["tensor"] == pytest.approx(cycles / ghz / 1e3)
        assert fl.gather_rows == [8, 8]             # K and V: 256 keys in 32-token rows
    # a 64-token chunk (G = 4: two 128-row blocks of 32 tokens) on no context, and 600 on 2000
    assert mod.prefill_blocks(64, 0) == [(32, 1), (64, 1)]
    assert mod.prefill_blocks(600, 2000)[:2] == [(2032, 1), (2064, 2)]
    assert len(mod.prefill_blocks(600, 2000)) == 19


def test_floor_grows_with_the_work(load_script):
    """More sequences never lower a floor (the model is monotone in every engine), and a
    prefill floor on trn2 picks the best P^T split between DMA and PE."""
    mod = load_script("bench_floors")          # puts scripts/ on the path
    import _pa_workloads as wl
    small = wl.Workload("s", "mixed", (256, 1, 1), (512, 3000, 5000))
    big = wl.Workload("b", "mixed", (256, 1, 1, 1), (512, 3000, 5000, 4000))
    for target in ("trn1", "trn2"):
        assert mod.floor_of(small, target)["modeled_us"] < mod.floor_of(big, target)["modeled_us"]
    pre = wl.Workload("p", "prefill", (2048,), (2048,))
    best = mod.floor_of(pre, "trn2")
    fl = mod.Floor("trn2")
    fl.prefill(2048, 2048, wl.HKV, wl.D)
    for share in (0.0, 1.0):
        assert best["modeled_us"] <= mod.modeled(fl, wl.D, share)["modeled_us"]


def test_profile_call_sites_attributes_time_to_kernel_lines(run_quick):
    """Every call site is a kernel line outside the op layer, and the sites of each resource
    add up to at most its total (the top few of them)."""
    doc = run_quick("profile_call_sites", "--top", "3")
    assert [r["run"] for r in doc["rows"]] == ["decode_8:trn1", "mixed_1x128+6:trn2"]
    op_layer = ("@legacy.py:", "@legacy_dma.py:", "@current.py:", "@current_dma.py:")
    for row in doc["rows"]:
        assert row["modeled_us"] > 0 and {"dma", "tensor", "scalar"} <= set(row["resources"])
        for name, res in row["resources"].items():
            assert 1 <= len(res["sites"]) <= 3
            assert sum(us for _, us, _ in res["sites"]) <= res["us"] * (1 + 1e-9)
            assert not any(tag in site for site, _, _ in res["sites"] for tag in op_layer), name
    ports = set(doc["rows"][0]["resources"])
    assert {"port vector+scalar", "port vector+gpsimd"} <= ports          # trn1's shared ports
