"""The hardware-evidence suite (scripts/bench_evidence.py) without network: the table of published
measurements is consistent, the classification and statistics follow their stated rules, an
unavailable source is skipped with its reason, and the project's own equivalent runs."""
from __future__ import annotations

import importlib.util
import json
import math
import re
import sys
from pathlib import Path

import pytest


def _script(name):
    """scripts/<name>.py as a module, under the key tests/conftest.py's load_script uses."""
    key = f"_nki_pa_script_{name}"
    if key not in sys.modules:
        path = Path(__file__).resolve().parents[2] / "scripts" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(key, path)
        sys.modules[key] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[key])
    return sys.modules[key]


bench = _script("bench_evidence")
from evidence import builders, report, sources  # noqa: E402  (put on sys.path by the script)

REQUIRED = ("id", "source", "citation", "kernel", "inputs", "shapes", "dtype", "target",
            "how_measured", "measured_us")


def test_table_is_consistent():
    cases = bench.load_table()
    ids = [c["id"] for c in cases]
    assert len(ids) == len(set(ids)) and len(cases) >= 25
    for c in cases:
        missing = [k for k in REQUIRED if k not in c]
        assert not missing, (c.get("id"), missing)
        assert c["target"] in ("trn1", "trn2") and c["measured_us"] > 0
        assert c["inputs"]["builder"] in builders.BUILDERS, c["id"]
        k = c["kernel"]
        if "own" in k:
            assert "own" in c["how_measured"], c["id"]          # labelled as the project's equivalent
        else:
            assert re.fullmatch(r"[0-9a-f]{40}", k["commit"]) and k["repo"].count("/") == 1
            assert k["path"].endswith(".py") and k["function"]
            assert k["commit"][:12] in c["citation"] or k["repo"] in c["citation"]
        if c.get("class"):
            assert c["class"] in report.CLASSES and c.get("class_evidence"), c["id"]
        if c.get("sim_config"):
            assert c.get("sim_config_reason"), c["id"]
        prof = c.get("profile") or {}
        for e, frac in (prof.get("engine_active_fraction") or {}).items():
            assert 0 <= frac <= 1, (c["id"], e)
        if "measured_range_us" in c:
            lo, hi = c["measured_range_us"]
            assert lo <= c["measured_us"] <= hi, c["id"]


def test_statistics_follow_their_definitions():
    s = report.summary([1.0, 1.25, 0.5, 4.0])
    assert s["n"] == 4 and s["within_25pct"] == 0.5 and s["within_2x"] == 0.75
    assert math.isclose(s["geomean"], (1.0 * 1.25 * 0.5 * 4.0) ** 0.25)
    assert report.summary([])["n"] == 0


def test_classification_rule():
    base = {"id": "x", "profile": {"hbm_read_bytes": 100, "hbm_write_bytes": 0}}
    assert report.classify(base, 105)[0] == "clean"
    assert report.classify(base, 80)[0] == "compiler-rewritten"          # 1.25x the source's bytes
    spill = {"id": "y", "profile": {"hbm_read_bytes": 100, "spill_save_bytes": 1}}
    assert report.classify(spill, 100)[0] == "compiler-rewritten"
    assert report.classify({"id": "z", "class": "ambiguous", "class_evidence": "e"}, 1) == ("ambiguous", "e")
    with pytest.raises(ValueError, match="class must be one of"):
        report.classify({"id": "w", "class": "nice"}, 1)


def test_offline_source_is_skipped_with_its_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("NKI_PA_EVIDENCE_CACHE", str(tmp_path))

    def offline(*a, **k):
        raise OSError("network is unreachable")
    monkeypatch.setattr(sources.urllib.request, "urlopen", offline)
    case = next(c for c in bench.load_table() if "own" not in c["kernel"])
    rows = bench.run_cases([case], mirror=tmp_path, log=lambda *_: None)
    assert rows[0]["status"].startswith("skipped: cannot fetch") and "--mirror" in rows[0]["status"]
    assert not (tmp_path / "traces").exists()


@pytest.mark.simulation
def test_quick_run_models_the_own_equivalent(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("NKI_PA_EVIDENCE_CACHE", str(tmp_path))
    out = tmp_path / "ev.json"
    page = tmp_path / "page.txt"
    page.write_text(f"intro\n{bench.BEGIN}\nold\n{bench.END}\noutro\n")
    assert bench.main(["--quick", "--json", str(out), "--markdown", str(page)]) == 0
    doc = json.loads(out.read_text())
    (row,) = doc["rows"]
    assert row["status"] == "ok" and row["correct"] and row["kernel"].startswith("own:")
    assert row["instructions"]["scalar"] == 512 and row["modeled_us"] > 0
    text = page.read_text()
    assert text.startswith("intro\n") and text.endswith("outro\n") and "old" not in text
    assert row["id"] in text
