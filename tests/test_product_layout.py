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
