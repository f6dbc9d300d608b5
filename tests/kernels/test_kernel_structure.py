"""Structure rules of the device code, every module of nki_kernels/ (docs of nki_kernels.ops):
only the op layer's API modules and the API-selection module name an NKI package; no function
or lambda has more than 16 parameters; no private name is imported across modules; no dict is
used as growing or record-like state (:func:`dict_state` states the rule). Each rule has
must-fail snippets."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2] / "nki_kernels"
NKI_MODULES = {"ops/legacy.py", "ops/legacy_dma.py", "ops/current.py", "ops/current_dma.py",
               "toolchain.py"}
# the benchmarks' legacy-API baseline kernels (not product kernels) import the legacy package
LEGACY_ONLY = {"baselines/per_block_paged_attention.py", "baselines/kv_write_per_token.py",
               "baselines/block_copy_batched.py"}
MAX_PARAMS = 16
# Kernel entry points wider than MAX_PARAMS, each with its reason: every HBM tensor of a kernel
# is an argument of its own (the legacy API documents no tuples of tensors as arguments).
WIDE_KERNELS = {"scheduled_pair_attention": "two classes' tensors, one argument each"}


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
            via_nki = mod == "nki_kernels.toolchain" and rel not in NKI_MODULES | LEGACY_ONLY
            if (names_nki and rel not in NKI_MODULES) or via_nki:
                bad.append(f"{rel}: {mod}")
    assert bad == []


def wide_signatures(tree) -> list:
    """Functions and lambdas with more than MAX_PARAMS parameters (``*args`` / ``**kw`` count
    one each): group what varies together in a frozen dataclass instead."""
    wide = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
            if n > MAX_PARAMS and getattr(node, "name", None) not in WIDE_KERNELS:
                wide.append(f"line {node.lineno} {getattr(node, 'name', 'lambda')}: {n}")
    return wide


@pytest.mark.parametrize("path", _modules(), ids=_rel)
def test_signatures_have_at_most_16_parameters(path):
    assert wide_signatures(ast.parse(path.read_text())) == []


def test_no_private_name_is_imported_across_modules():
    bad = [f"{_rel(p)}: {mod}.{name}" for p in _modules()
           for mod, name in _imports(ast.parse(p.read_text()))
           if name and name.startswith("_") and name != "__future__" and mod != "__future__"]
    assert bad == []


_DICT_MAKERS = ("dict", "defaultdict", "OrderedDict")
_DICT_MUTATORS = ("update", "setdefault", "pop", "popitem", "clear", "__setitem__",
                  "__delitem__")


def _makes_dict(value) -> bool:
    return isinstance(value, (ast.Dict, ast.DictComp)) or (
        isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
        and value.func.id in _DICT_MAKERS)


def _dict_names(nodes) -> set:
    """Names bound by ``name = {...}`` / ``{k: v for ...}`` / ``dict(...)`` in ``nodes``."""
    names = set()
    for node in nodes:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None \
                and _makes_dict(node.value):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def _mutations(nodes, names) -> list:
    """Lines in ``nodes`` that change a dict bound to one of ``names``: an item stored, deleted
    or augmented (``d[k] = v``, ``del d[k]``, ``d[k] += v``) or a mutating method call."""
    bad = []
    for node in nodes:
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        for t in targets:
            if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) \
                    and t.value.id in names:
                bad.append(f"line {node.lineno}: item of dict {t.value.id} changed")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in _DICT_MUTATORS and isinstance(node.func.value, ast.Name) \
                and node.func.value.id in names:
            bad.append(f"line {node.lineno}: dict {node.func.value.id}.{node.func.attr}()")
    return bad


def dict_state(tree) -> list:
    """The rule for device code (no dict as growing or record-like state):

    1. no subscript by a string constant, read or write (``cfg["geo"]``, ``bufs["st"] = t``): a
       record's fields are a frozen dataclass's attributes;
    2. a dict a function builds (``{...}``, a dict comprehension, ``dict()``) is never changed
       after it is built (no item stored / deleted / augmented, no update / setdefault / pop /
       popitem / clear); a module-level dict is changed by no statement of the module.
    Building a new dict (``{**kw, "x": 1}``) and reading a table by a computed key are fine."""
    bad = [f"line {n.lineno}: {ast.unparse(n)} (string key)" for n in ast.walk(tree)
           if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant)
           and isinstance(n.slice.value, str)]
    module_dicts = _dict_names(tree.body)
    bad += _mutations(ast.walk(tree), module_dicts)
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            local = _dict_names(ast.walk(fn)) - module_dicts
            bad += _mutations(ast.walk(fn), local)
    return sorted(set(bad))


@pytest.mark.parametrize("path", _modules(), ids=_rel)
def test_no_dict_state_in_device_code(path):
    assert dict_state(ast.parse(path.read_text())) == []


_WIDE = {
    "17 parameters": "def f(" + ", ".join(f"a{i}" for i in range(17)) + "):\n    pass\n",
    "15 and *args and **kw": "def f(" + ", ".join(f"a{i}" for i in range(15)) + ", *a, **k):\n"
                             "    pass\n",
    "17-parameter lambda": "g = lambda " + ", ".join(f"a{i}" for i in range(17)) + ": 0\n",
}
_DICT_STATE = {
    "string-key store": "def f():\n    cfg = {}\n    cfg['x'] = 1\n",
    "string-key read": "def f(cfg):\n    return cfg['geo']\n",
    "computed-key store": "def f(k):\n    geo = dict(a=1)\n    geo[k] = 2\n",
    "augmented item": "def f(k):\n    n = {k: 0 for k in 'ab'}\n    n[k] += 1\n",
    "update": "def f(t):\n    bufs = dict(st=t)\n    bufs.update(x=t)\n",
    "module dict": "_CACHE = {}\ndef f(k, v):\n    _CACHE[k] = v\n",
    "delete": "def f(k):\n    d = {}\n    del d[k]\n",
}
_PASSING = ("from dataclasses import dataclass\n_TABLE = {'add': 1}\n@dataclass(frozen=True)\n"
            "class C:\n    x: int\ndef f(op, kw, flag):\n    kw = {} if flag else {'a': 1}\n"
            "    kw = {**kw, 'b': 2}\n    return C(x=_TABLE[op]), kw\n")


@pytest.mark.parametrize("case", sorted(_WIDE))
def test_the_signature_rule_rejects(case):
    assert wide_signatures(ast.parse(_WIDE[case])) != []


@pytest.mark.parametrize("case", sorted(_DICT_STATE))
def test_the_dict_rule_rejects(case):
    assert dict_state(ast.parse(_DICT_STATE[case])) != []


def test_the_structure_rules_accept_frozen_records_and_new_dicts():
    tree = ast.parse(_PASSING)
    assert wide_signatures(tree) == [] and dict_state(tree) == []


def test_the_checks_can_fail(tmp_path, monkeypatch):
    (tmp_path / "ops").mkdir()
    (tmp_path / "k.py").write_text("import nki.language as nl\nfrom a import _b\n"
                                   "def f(" + ", ".join(f"a{i}" for i in range(17)) + "):\n"
                                   "    cfg = {}\n    cfg['x'] = 1\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    for check in (test_only_the_api_modules_name_an_nki_package,
                  test_no_private_name_is_imported_across_modules):
        with pytest.raises(AssertionError):
            check()
    for check in (test_signatures_have_at_most_16_parameters, test_no_dict_state_in_device_code):
        with pytest.raises(AssertionError):
            check(tmp_path / "k.py")


def test_every_wide_kernel_exemption_names_a_wide_kernel():
    """Each WIDE_KERNELS entry is a function of nki_kernels/ that is wider than MAX_PARAMS (an
    exemption cannot outlive its reason), and the rule still holds for every other function."""
    widths = {}
    for p in _modules():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name in WIDE_KERNELS:
                a = node.args
                widths[node.name] = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs)
    assert set(widths) == set(WIDE_KERNELS)
    assert all(n > MAX_PARAMS for n in widths.values())
