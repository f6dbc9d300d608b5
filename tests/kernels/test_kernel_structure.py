"""Structure rules of the device code (docs of nki_kernels.ops): only the op layer's API modules
and the API-selection module name an NKI package; kernel signatures have at most 16 parameters;
no private name is imported across modules; kernel drivers keep no mutable dict state."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2] / "nki_kernels"
# The scheduled family on the op layer (the legacy-only kernels follow when they are ported).
OP_LAYER_FAMILY = ("scheduled_attention.py", "sched_config.py", "sched_core.py",
                   "sched_decode.py", "sched_item.py", "sched_tile.py", "tile_ops.py")
NKI_MODULES = {"ops/legacy.py", "ops/current.py", "_nki.py"}
LEGACY_ONLY = {"flash_paged_attention.py", "flash_core.py", "kv_load.py", "block_tables.py",
               "kv_cache_update.py", "block_copy.py", "mla_cache_update.py", "mla_attention.py",
               "row_tiles.py", "baselines/per_block_paged_attention.py",
               "baselines/kv_write_per_token.py", "baselines/block_copy_batched.py"}
MAX_PARAMS = 16


def _modules():
    return sorted(p for p in ROOT.rglob("*.py"))


def _rel(p):
    return p.relative_to(ROOT).as_posix()


def _imports(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, None
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                yield node.module or "", a.name


def test_only_the_api_modules_name_an_nki_package():
    bad = []
    for p in _modules():
        rel = _rel(p)
        for mod, _ in _imports(ast.parse(p.read_text())):
            names_nki = mod == "nki" or mod.startswith("nki.") or mod.startswith("neuronxcc")
            via_nki = mod == "nki_kernels._nki" and rel not in NKI_MODULES | LEGACY_ONLY
            if (names_nki and rel not in NKI_MODULES) or via_nki:
                bad.append(f"{rel}: {mod}")
    assert bad == []


@pytest.mark.parametrize("name", OP_LAYER_FAMILY)
def test_signatures_have_at_most_16_parameters(name):
    tree = ast.parse((ROOT / name).read_text())
    wide = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
            if n > MAX_PARAMS:
                wide.append(f"{node.name}: {n}")
    assert wide == []


def test_no_private_name_is_imported_across_modules():
    bad = [f"{_rel(p)}: {mod}.{name}" for p in _modules()
           for mod, name in _imports(ast.parse(p.read_text()))
           if name and name.startswith("_") and name != "__future__" and mod != "__future__"]
    assert bad == []


@pytest.mark.parametrize("name", OP_LAYER_FAMILY)
def test_no_dict_state_in_the_drivers(name):
    # no `cfg["key"] = ...` / `.update(...)` on dict literals or dict() objects
    tree = ast.parse((ROOT / name).read_text())
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant) \
                        and isinstance(t.slice.value, str):
                    bad.append(f"line {node.lineno}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "dict":
            bad.append(f"line {node.lineno} dict()")
    assert bad == []


def test_the_checks_can_fail(tmp_path, monkeypatch):
    (tmp_path / "ops").mkdir()
    (tmp_path / "k.py").write_text("import nki.language as nl\nfrom a import _b\n"
                                   "def f(" + ", ".join(f"a{i}" for i in range(17)) + "):\n"
                                   "    cfg = {}\n    cfg['x'] = 1\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    monkeypatch.setitem(globals(), "OP_LAYER_FAMILY", ("k.py",))
    for check in (test_only_the_api_modules_name_an_nki_package,
                  test_no_private_name_is_imported_across_modules):
        with pytest.raises(AssertionError):
            check()
    for check in (test_signatures_have_at_most_16_parameters, test_no_dict_state_in_the_drivers):
        with pytest.raises(AssertionError):
            check("k.py")
