"""``nki-pa demo --quick`` end to end: files, exit codes, early failures (about a second)."""
from __future__ import annotations

import importlib.util
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from host.attention import paged_attention
from nki_pa_cli import demo
from nki_pa_cli.cli import EXIT_FAIL, EXIT_PASS, EXIT_USAGE, main

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.simulation


@pytest.fixture
def sim_env(monkeypatch):
    monkeypatch.setenv("NKI_PA_BACKEND", "sim")


def test_quick_demo_writes_traces_summary_and_png(tmp_path, capsys, sim_env):
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--out", str(out), "--no-progress"]) == EXIT_PASS
    text = capsys.readouterr().out
    assert "MODELED" in text and text.rstrip().splitlines()[-1].startswith("PASS")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["passed"] is True
    kernels = demo.kernel_choices()
    assert [(r["kernel"], r["target"]) for r in summary["runs"]] == [
        (k, t) for k in kernels for t in ("trn1", "trn2")]
    default = inspect.signature(paged_attention).parameters["kernel"].default
    assert len(kernels) >= 2 and kernels[0] == default                       # the default first
    for run in summary["runs"]:
        assert run["max_abs_error"] <= summary["tolerance"]
        assert f"{run['max_abs_error']:.2e}" in text
        assert run["modeled_us"] >= max(run["per_engine_us"].values()) > 0
        chrome = json.loads((out / run["trace"]).read_text())
        slices = [e for e in chrome["traceEvents"] if e["ph"] == "X"]
        assert len(slices) == run["instructions"]
        dma_tid = next(e["tid"] for e in chrome["traceEvents"]
                       if e["ph"] == "M" and e["args"]["name"] == "dma")
        assert sum(e["tid"] == dma_tid for e in slices) == run["dma_instructions"]
        assert sum(e["args"]["bytes"] for e in slices if e["tid"] == dma_tid) == run["dma_bytes"]
    png = out / "modeled-engines.png"
    if importlib.util.find_spec("matplotlib") is None:     # the README's minimal install
        assert not png.exists()              # (the note: test_demo_runs_without_matplotlib_...)
    else:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_demo_fails_with_exit_code_1_when_the_error_exceeds_the_tolerance(tmp_path, capsys, sim_env):
    # mixed precision gives ~1e-3 here; a 1e-9 bound must fail
    assert main(["demo", "--quick", "--no-png", "--no-progress", "--tolerance", "1e-9",
                 "--out", str(tmp_path)]) == EXIT_FAIL
    text = capsys.readouterr().out
    assert "FAIL" in text.splitlines()[-1]
    assert json.loads((tmp_path / "summary.json").read_text())["passed"] is False
    assert not (tmp_path / "modeled-engines.png").exists()


def test_demo_runs_without_matplotlib_and_says_there_is_no_png(tmp_path, capsys, monkeypatch,
                                                                sim_env):
    # the README's first install command has no matplotlib: the demo must still pass
    monkeypatch.setitem(sys.modules, "matplotlib", None)         # import matplotlib -> ImportError
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--out", str(out), "--no-progress"]) == EXIT_PASS
    captured = capsys.readouterr()
    assert "no PNG" in captured.err and "matplotlib" in captured.err
    assert captured.out.rstrip().splitlines()[-1].startswith("PASS")
    assert (out / "summary.json").exists() and not (out / "modeled-engines.png").exists()


@pytest.mark.parametrize("bad", [["--seed", "-1"], ["--seed", "x"]])
def test_bad_seed_is_a_usage_error_not_a_traceback(bad, capsys):
    with pytest.raises(SystemExit) as e:
        main(["demo", "--quick", *bad])
    assert e.value.code == EXIT_USAGE
    assert "--seed: must be an integer >= 0" in capsys.readouterr().err


def test_version(capsys):
    import tomllib

    from nki_pa_cli import __version__

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    want = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert capsys.readouterr().out.strip() == f"nki-pa {want}" and __version__ == want


def test_progress_bar_fits_an_80_column_terminal(monkeypatch):
    import io
    import os as _os

    from nki_pa_cli.progress import Progress

    monkeypatch.setattr("shutil.get_terminal_size", lambda fallback=None: _os.terminal_size((80, 24)))
    stream = io.StringIO()
    with Progress(3, label="nki-pa demo", stream=stream, enabled=True) as bar:
        bar.advance(note="x" * 200)
        bar.advance(note="short")
    lines = stream.getvalue().split("\r")
    assert all(len(line.rstrip("\n")) <= 79 for line in lines)
    assert lines[-1].rstrip("\n").rstrip().endswith("short")


@pytest.mark.parametrize("bad", [["--tolerance", "0"], ["--tolerance", "nan"], ["--tolerance", "x"],
                                 ["--bogus"]])
def test_demo_rejects_bad_arguments(bad, capsys):
    with pytest.raises(SystemExit) as e:
        main(["demo", "--quick", *bad])
    assert e.value.code == EXIT_USAGE


def test_demo_refuses_a_non_simulator_backend(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("NKI_PA_BACKEND", "neuron")
    assert main(["demo", "--quick", "--no-png", "--out", str(tmp_path / "x")]) == EXIT_USAGE
    assert "NKI_PA_BACKEND" in capsys.readouterr().err


def test_demo_tolerance_is_the_test_table_entry(tol):
    assert demo.TOLERANCE == tol("mixed", np.float32)[0]


def test_demo_batches_are_mixed_gqa_and_match_their_inputs():
    for batch in (demo.QUICK, demo.FULL):
        assert sum(q > 1 for q in batch.query_lens) >= 1 and sum(q == 1 for q in batch.query_lens) >= 2
        assert batch.num_heads // batch.num_kv_heads > 1
    for batch in (demo.QUICK,):                       # (the full batch's cache is ~130 MB)
        q, k, v, cache, tables, qlens, clens = demo.make_inputs(batch)
        assert q.shape == (sum(batch.query_lens), batch.num_heads, batch.head_size)
        assert k.shape == v.shape == (q.shape[0], batch.num_kv_heads, batch.head_size)
        used = np.concatenate([tables[i, :-(-c // batch.block_size)] for i, c in enumerate(clens)])
        assert len(set(used.tolist())) == used.size and used.min() >= 0 and used.max() < cache.shape[1]


def test_module_entry_point_exit_code(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "nki_pa_cli", "demo", "--quick", "--no-png",
                           "--tolerance", "1e-9", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NKI_PA_BACKEND": "sim",
                               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    assert proc.returncode == EXIT_FAIL, proc.stderr
    assert proc.stdout.rstrip().splitlines()[-1].startswith("FAIL")

