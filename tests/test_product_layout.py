"""The product's family sub-packages and the arrows allowed between them.

host/ and nki_kernels/ each hold shared top-level modules (contract, validation, launch, op
layer ``nki_kernels.ops``, ...) and one sub-package per family. A family module may import the shared modules of
either package and the families its row below lists, nothing else (module-level and
function-level imports alike):

    host.dense       (the flat-batch plan, masks, block tables, GQA packing)  -> nki_kernels.dense
    host.scheduled   (the block-sparse schedule and its kernel inputs)        -> host.cache, nki_kernels.scheduled
    host.cache       (cache layouts and cache ops, MLA latent cache)          -> nki_kernels.cache
    host.mla         (MLA plan, overlay, reference)                           -> host.cache, host.scheduled, nki_kernels.mla
    host.serving     (KV manager, transformers backend, torch ops)            -> every host family, every kernel family
    nki_kernels.mla  (built on the scheduled family's steps)                  -> nki_kernels.scheduled
    nki_kernels.baselines (comparison kernels for the benchmarks)             -> nki_kernels.dense
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOST_FAMILIES = ("dense", "scheduled", "cache", "mla", "serving")
KERNEL_FAMILIES = ("scheduled", "dense", "mla", "cache", "baselines")
SHARED = ("nki_kernels.ops",)     # the op layer: a shared layer under every kernel family
ALLOWED = {
    "host.dense": {"nki_kernels.dense"},
    "host.scheduled": {"host.cache", "nki_kernels.scheduled"},
    "host.cache": {"nki_kernels.cache"},
    "host.mla": {"host.cache", "host.scheduled", "nki_kernels.mla"},
    "host.serving": {f"host.{f}" for f in HOST_FAMILIES} | {f"nki_kernels.{f}" for f in KERNEL_FAMILIES},
    "nki_kernels.scheduled": set(),
    "nki_kernels.dense": set(),
    "nki_kernels.mla": {"nki_kernels.scheduled"},
    "nki_kernels.cache": set(),
    "nki_kernels.baselines": {"nki_kernels.dense"},
}


def family_of(module: str) -> str | None:
    """``host.scheduled.schedule`` -> ``host.scheduled``; a shared top-level module -> None."""
    parts = module.split(".")
    if len(parts) >= 3 and parts[0] in ("host", "nki_kernels") and ".".join(parts[:2]) not in SHARED:
        return ".".join(parts[:2])
    return None


def imported_modules(source: str) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append(node.module)
            out += [f"{node.module}.{a.name}" for a in node.names]   # "from host.cache import x"
    return out


def violations(module: str, source: str) -> list[str]:
    """The family arrows of ``module``'s imports that ALLOWED does not list."""
    src = family_of(module)
    if src is None:
        return []
    bad = []
    for target in imported_modules(source):
        dst = family_of(target)
        if dst is None or dst == src or not any(dst == f"{p}.{f}" for p, fams in (
                ("host", HOST_FAMILIES), ("nki_kernels", KERNEL_FAMILIES)) for f in fams):
            continue
        if dst not in ALLOWED[src]:
            bad.append(f"{module} -> {target}")
    return bad


def _modules():
    for pkg in ("host", "nki_kernels"):
        for p in sorted((ROOT / pkg).rglob("*.py")):
            rel = p.relative_to(ROOT).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            yield ".".join(parts), p


def test_every_family_is_a_subpackage_with_an_allowed_row():
    for pkg, fams in (("host", HOST_FAMILIES), ("nki_kernels", KERNEL_FAMILIES)):
        for f in fams:
            assert (ROOT / pkg / f / "__init__.py").is_file(), f"{pkg}/{f}/__init__.py missing"
            assert f"{pkg}.{f}" in ALLOWED


def test_family_imports_follow_the_allowed_arrows():
    bad = [v for mod, path in _modules() for v in violations(mod, path.read_text())]
    assert bad == [], bad


def test_family_arrow_check_can_fail():
    # must fail: the dense family planning reaching into the scheduled family, and the cache
    # kernels into the scheduled kernel; must pass: shared modules and a listed arrow
    assert violations("host.dense.plan", "from host.scheduled.schedule import build_schedule\n")
    assert violations("nki_kernels.cache.block_copy", "import nki_kernels.scheduled.sched_core\n")
    assert violations("host.cache.cache_ops", "from host.mla import mla_attention\n")
    assert not violations("host.dense.plan", "from host.validation import fail\n"
                                             "from nki_kernels import contract\n")
    assert not violations("host.mla.mla_attention", "from host.scheduled.scheduled import x\n")


# ------------------------------------------------------------------ private names stay private
PRODUCT_DIRS = ("host", "nki_kernels", "nki_sim", "nki_pa_cli", "scripts")


def private_imports(module: str, source: str, is_package=lambda m: False) -> list[str]:
    """Imports in ``module`` of a private name (``_x``, not dunder) that another module defines:
    ``from m import _x`` (a function, class or constant; a private *module* of the importer's own
    top-level package is fine), ``import a._x`` / ``from a import _x`` of another package's
    private module. ``is_package(name)`` tells whether ``name`` is a module (not a function)."""
    top = module.split(".")[0]
    bad = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:          # relative: resolve against the importing module's package
                pkg = module.split(".")[:-node.level] if module.count(".") else [top]
                base = ".".join(pkg + ([node.module] if node.module else []))
            for a in node.names:
                name = a.name
                if not name.startswith("_") or name.startswith("__"):
                    if any(p.startswith("_") and not p.startswith("__") for p in base.split(".")[1:]) \
                            and base.split(".")[0] != top:
                        bad.append(f"{module}: from {base} import {name}")
                    continue
                full = f"{base}.{name}"
                if is_package(full):
                    if full.split(".")[0] != top:
                        bad.append(f"{module}: from {base} import {name} (private module)")
                else:
                    bad.append(f"{module}: from {base} import {name}")
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] != top and any(p.startswith("_") and not p.startswith("__") for p in parts[1:]):
                    bad.append(f"{module}: import {a.name}")
    return bad


def _is_module(name: str) -> bool:
    parts = name.split(".")
    base = ROOT.joinpath(*parts)
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file() or \
        (ROOT / "scripts" / f"{parts[-1]}.py").is_file()


def _product_modules():
    for d in PRODUCT_DIRS:
        for p in sorted((ROOT / d).rglob("*.py")):
            rel = p.relative_to(ROOT).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            if d == "scripts":          # scripts import each other as top-level modules
                parts = ("scripts",) + rel.parts[1:]
            yield ".".join(parts), p


def test_no_private_name_is_imported_across_modules():
    bad = [v for mod, p in _product_modules() for v in private_imports(mod, p.read_text(), _is_module)]
    assert bad == [], bad


def test_private_import_check_can_fail():
    mod = lambda name: name in ("host._arrays", "nki_sim.engines._x")   # noqa: E731
    # must fail: a private function of another module, another package's private module
    assert private_imports("host.attention", "from host.launch import _run\n", mod)
    assert private_imports("host.launch", "from nki_sim.engines import _x\n", mod)
    assert private_imports("nki_sim.engines.dma", "from .events import _basic\n", mod)
    # must pass: public names, the importer's own package's private module, aliases
    assert not private_imports("host.attention", "from host import _arrays\n"
                                                 "from host.launch import launch_kernel as _l\n", mod)
