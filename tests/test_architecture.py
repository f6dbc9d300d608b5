"""Meta-tests that keep the architecture visible: device / host / simulator never blur.

These read source files as text; they run in milliseconds.
"""

from __future__ import annotations

import ast
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


@pytest.mark.parametrize("path", [p for p in _py_files("nki_kernels") if p.name != "toolchain.py"], ids=_rel)
def test_device_code_imports_nki_only_through_the_shim(path):
    bad = [m for m in _imports(path)
           if m.split(".")[0] in ("neuronxcc", "nki", "nki_sim", "host", "torch")]
    assert not bad, f"{_rel(path)} imports {bad}; device code imports NKI only via nki_kernels.toolchain"


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


# ---------------------------------------------------------------------------- nki_sim layering
# Every nki_sim module's layer, lowest first; a module may import modules of its own layer or
# of lower layers only, the two front ends never import each other, and the import graph
# (module-level and function-level imports alike) has no cycle (nki_sim/README.md,
# "Architecture").  Modules of the engine and current-API packages take their package's layer.
SIM_LAYERS = ("foundation", "settings", "observation", "core", "engines", "runtime",
              "legacy", "current", "package")
SIM_MODULE_LAYERS = {
    "nki_sim.errors": "foundation", "nki_sim.dtypes": "foundation", "nki_sim.state": "foundation",
    "nki_sim.versions": "foundation",
    "nki_sim.target": "settings", "nki_sim.config": "settings", "nki_sim.sdk": "settings",
    "nki_sim.blas": "settings",
    "nki_sim.trace": "observation", "nki_sim.cost": "observation",
    "nki_sim.cost_constants": "observation", "nki_sim.cost_report": "observation",
    "nki_sim.indexing": "core", "nki_sim.memory": "core", "nki_sim.positions": "core",
    "nki_sim.deps": "core", "nki_sim.access": "core", "nki_sim.tensor": "core", "nki_sim.alu": "core",
    "nki_sim.runtime": "runtime", "nki_sim.loops": "runtime", "nki_sim.arguments": "runtime",
    "nki_sim.legacy": "legacy", "nki_sim.legacy.nki_api": "legacy", "nki_sim.legacy.launch": "legacy",
    "nki_sim.legacy.tensor": "legacy", "nki_sim.legacy.assign": "legacy",
    "nki_sim.legacy.compute": "legacy", "nki_sim.legacy.dma": "legacy",
    "nki_sim.legacy.kernel_scope": "legacy", "nki_sim.legacy.nki_typing": "legacy",
    "nki_sim.legacy.compiler": "legacy",
    "nki_sim.legacy.language": "legacy", "nki_sim.legacy.language.creation": "legacy",
    "nki_sim.legacy.language.elementwise": "legacy", "nki_sim.legacy.language.misc": "legacy",
    "nki_sim.legacy.language.reduce": "legacy", "nki_sim.legacy.language.tensor_engine": "legacy",
    "nki_sim.legacy.isa": "legacy", "nki_sim.legacy.isa.constants": "legacy",
    "nki_sim.legacy.isa.scalar_vector": "legacy", "nki_sim.legacy.isa.select": "legacy",
    "nki_sim.legacy.isa.tensor_engine": "legacy", "nki_sim.legacy.isa.stats": "legacy",
    "nki_sim": "package", "nki_sim.install": "package",
}
SIM_PACKAGE_LAYERS = {"nki_sim.engines": "engines", "nki_sim.current": "current"}
FRONT_ENDS = ("legacy", "current")


def _module_names(root: Path, package: str) -> dict:
    """Dotted module name -> (path, is_package) of every module of ``package`` under ``root``."""
    mods = {}
    for p in sorted((root / package).rglob("*.py")):
        parts = list(p.relative_to(root).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        mods[".".join(parts)] = (p, is_pkg)
    return mods


def import_graph(root: Path, package: str) -> dict:
    """Module -> set of the package's modules it imports, at any level of the file (functions
    included).  ``from X import n`` depends on ``X.n`` when that is a module, else on ``X``;
    importing ``a.b.c`` also runs the ``__init__`` of each package on the way that is not an
    ancestor of the importing module, so those are dependencies too."""
    mods = _module_names(root, package)
    graph = {}
    for name, (path, is_pkg) in mods.items():
        pkg = name.split(".") if is_pkg else name.split(".")[:-1]
        ancestors = {".".join(name.split(".")[:i]) for i in range(1, len(name.split(".")))}
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = ".".join(pkg[:len(pkg) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                for a in node.names:
                    targets.append(f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base)
            for t in targets:
                parts = t.split(".")
                for i in range(1, len(parts) + 1):
                    m = ".".join(parts[:i])
                    if m in mods and m != name and (m == t or m not in ancestors):
                        deps.add(m)
        graph[name] = deps
    return graph


def find_cycles(graph: dict) -> list:
    """Strongly connected components with more than one module (or a self-import)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                out.append(sorted(comp))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def sim_layer(module: str):
    if module in SIM_MODULE_LAYERS:
        return SIM_MODULE_LAYERS[module]
    for pkg, layer in SIM_PACKAGE_LAYERS.items():
        if module == pkg or module.startswith(pkg + "."):
            return layer
    return None


def layer_violations(graph: dict) -> list:
    """Arrows against the layer order, between the two front ends, or from unlayered modules."""
    rank = {layer: i for i, layer in enumerate(SIM_LAYERS)}
    bad = []
    for m, deps in sorted(graph.items()):
        lm = sim_layer(m)
        if lm is None:
            bad.append(f"{m} has no layer in SIM_MODULE_LAYERS")
            continue
        for d in sorted(deps):
            ld = sim_layer(d)
            if ld is None:
                continue                        # reported as a module of its own
            if lm in FRONT_ENDS and ld in FRONT_ENDS and lm != ld:
                bad.append(f"{m} ({lm}) imports {d} ({ld}): the front ends never import each other")
            elif rank[ld] > rank[lm] and not (lm in FRONT_ENDS and ld in FRONT_ENDS):
                bad.append(f"{m} ({lm}) imports {d} ({ld}), a higher layer")
    return bad


def test_simulator_has_no_import_cycle():
    cycles = find_cycles(import_graph(ROOT, "nki_sim"))
    assert not cycles, f"import cycles in nki_sim (function-level imports included): {cycles}"


def test_simulator_imports_follow_the_layers():
    bad = layer_violations(import_graph(ROOT, "nki_sim"))
    assert not bad, "nki_sim layering:\n" + "\n".join(bad)


def test_layer_checks_can_fail(tmp_path):
    """The cycle and layer checks trip on planted violations (a circle through a function-level
    import, a core module importing a front end, a front end importing the other, a module
    without a layer)."""
    pkg = tmp_path / "nki_sim"
    (pkg / "legacy").mkdir(parents=True)
    (pkg / "current").mkdir()
    (pkg / "__init__.py").write_text("from . import tensor\n")
    (pkg / "tensor.py").write_text("def f():\n    from .legacy import language\n")
    (pkg / "legacy" / "__init__.py").write_text("")
    (pkg / "legacy" / "language.py").write_text("from ..tensor import Tensor\nfrom ..current import x\n")
    (pkg / "current" / "__init__.py").write_text("")
    (pkg / "current" / "x.py").write_text("from .. import newmod\n")
    (pkg / "newmod.py").write_text("")
    g = import_graph(tmp_path, "nki_sim")
    assert g["nki_sim.tensor"] == {"nki_sim.legacy", "nki_sim.legacy.language"}
    assert find_cycles(g) == [["nki_sim.legacy.language", "nki_sim.tensor"]]
    bad = layer_violations(g)
    assert "nki_sim.tensor (core) imports nki_sim.legacy.language (legacy), a higher layer" in bad
    assert any("front ends never import each other" in b for b in bad)
    assert "nki_sim.newmod has no layer in SIM_MODULE_LAYERS" in bad
    assert find_cycles({"a": {"b"}, "b": set()}) == []
