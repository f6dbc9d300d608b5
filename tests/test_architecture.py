"""Meta-tests that keep the architecture visible: device / host / simulator never blur.

These read source files as text; they run in milliseconds.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("nki_kernels", "host", "nki_sim")
CLI = "nki_pa_cli"          # the command line: an application on top of host (it may print)
MAX_MODULE_LINES = 500


def _py_files(*dirs: str) -> list[Path]:
    files: list[Path] = []
    for d in dirs:
        files.extend(sorted((ROOT / d).rglob("*.py")))
    return files


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


@pytest.mark.parametrize("path", _py_files(*PACKAGES, CLI), ids=_rel)
def test_module_size_budget(path):
    n = len(path.read_text().splitlines())
    assert n <= MAX_MODULE_LINES, f"{_rel(path)} has {n} lines (> {MAX_MODULE_LINES}); split it by concern"


def _imports(path: Path) -> list[str]:
    text = path.read_text()
    mods = re.findall(r"^\s*import\s+([\w.]+)", text, flags=re.M)
    mods += re.findall(r"^\s*from\s+([\w.]+)\s+import", text, flags=re.M)
    return mods


@pytest.mark.parametrize("path", [p for p in _py_files("nki_kernels") if p.name != "_nki.py"], ids=_rel)
def test_device_code_imports_nki_only_through_the_shim(path):
    bad = [m for m in _imports(path)
           if m.split(".")[0] in ("neuronxcc", "nki", "nki_sim", "host", "torch")]
    assert not bad, f"{_rel(path)} imports {bad}; device code imports NKI only via nki_kernels._nki"


@pytest.mark.parametrize("path", _py_files("nki_sim"), ids=_rel)
def test_simulator_is_independent_of_the_product(path):
    bad = [m for m in _imports(path) if m.split(".")[0] in ("host", "nki_kernels")]
    assert not bad, f"{_rel(path)} imports {bad}; nki_sim must not depend on the product code"


@pytest.mark.parametrize("path", _py_files("host", CLI), ids=_rel)
def test_host_never_reaches_into_simulator_internals(path):
    # host may launch kernels through nki_kernels (which picks the backend) and read traces /
    # cost reports through nki_sim's public top level, never through private modules.
    bad = [m for m in _imports(path) if m.startswith("nki_sim.") and m.split(".")[1].startswith("_")]
    assert not bad, f"{_rel(path)} imports private simulator modules {bad}"


@pytest.mark.parametrize("path", _py_files("nki_sim", "host", "nki_kernels"), ids=_rel)
def test_library_code_does_not_print(path):
    # nl.device_print is the one API whose documented job is to print.
    lines, current_def = [], ""
    for i, line in enumerate(path.read_text().splitlines()):
        m = re.match(r"\s*def\s+(\w+)", line)
        if m:
            current_def = m.group(1)
        if re.match(r"\s*print\(", line) and current_def != "device_print":
            lines.append(i + 1)
    assert not lines, f"{_rel(path)} prints at lines {lines}; raise, warn or return instead"


@pytest.mark.parametrize("path", _py_files("tests", "scripts", "host", "nki_sim", CLI), ids=_rel)
def test_all_randomness_is_seeded(path):
    text = path.read_text()
    unseeded = re.findall(r"default_rng\(\s*\)", text)
    legacy = re.findall(r"np\.random\.(?:rand|randn|randint|random|uniform|normal|choice|permutation)\(", text)
    assert not unseeded and not legacy, (
        f"{_rel(path)} uses unseeded / global-state randomness: {unseeded + legacy}; "
        "use np.random.default_rng(seed)")


@pytest.mark.parametrize("path", _py_files(CLI), ids=_rel)
def test_cli_uses_only_public_product_modules(path):
    # the command line is a client of the library: no private modules, no device code directly
    bad = [m for m in _imports(path)
           if m.split(".")[0] in ("nki_kernels", "neuronxcc")
           or (m.split(".")[0] in ("host", "nki_sim") and any(p.startswith("_") for p in m.split(".")[1:]))]
    assert not bad, f"{_rel(path)} imports {bad}; use host's and nki_sim's public modules"


def test_budget_checks_can_fail(tmp_path):
    """The size and import checks above are real: they trip on a planted violation."""
    big = tmp_path / "big.py"
    big.write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    assert len(big.read_text().splitlines()) > MAX_MODULE_LINES
    bad = tmp_path / "bad.py"
    bad.write_text("import neuronxcc.nki.language as nl\nfrom nki_sim import x\n")
    assert [m.split(".")[0] for m in _imports(bad)] == ["neuronxcc", "nki_sim"]
