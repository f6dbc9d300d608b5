"""Every ```python block of README.md and docs/*.md runs as written (each in a fresh namespace,
so a block cannot lean on an earlier one). Blocks that import an optional extra (torch,
transformers, matplotlib) skip only when that extra is not installed."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# API sketches with elided arguments (``...``), kept as sketches on purpose
SKETCHES = {"docs/cost-model.md"}
OPTIONAL = ("torch", "transformers", "matplotlib")
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _blocks():
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        if rel in SKETCHES:
            continue
        for i, code in enumerate(_BLOCK.findall(path.read_text())):
            yield pytest.param(rel, code, id=f"{rel}#{i}")


BLOCKS = list(_blocks())


def test_the_docs_have_snippets():
    files = {p.values[0] for p in BLOCKS}
    assert {"README.md", "docs/host-api.md", "docs/integration.md"} <= files


@pytest.mark.simulation
@pytest.mark.parametrize("path, code", BLOCKS)
def test_snippet_runs_as_written(path, code, monkeypatch, tmp_path):
    for extra in OPTIONAL:
        if re.search(rf"^\s*(import|from) {extra}\b", code, re.M) and \
                importlib.util.find_spec(extra) is None:
            pytest.skip(f"needs the optional {extra}")
    monkeypatch.chdir(tmp_path)                 # anything a snippet writes stays out of the repo
    exec(compile(code, f"{path} (snippet)", "exec"), {"__name__": "__main__"})
