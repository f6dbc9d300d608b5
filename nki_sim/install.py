"""Register the simulator under the legacy ``neuronxcc.nki`` module names and, where no real one
exists, under the current ``nki`` ones.

``install(force=False)`` registers ``neuronxcc``, ``neuronxcc.nki``, ``.language``, ``.isa``,
``.isa.constants``, ``.typing`` and ``.compiler`` in ``sys.modules`` when no real ``neuronxcc``
is importable -- neither one with ``nki`` nor one without it (SDK 2.34), which stays untouched --
(always with ``force=True``) and returns whether it installed them.
Detection of the real package looks on ``sys.path`` only (never at our own registered
modules) and treats the PyPI placeholder, which raises on import, as absent.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import types

_NAMES = ("neuronxcc", "neuronxcc.nki", "neuronxcc.nki.language", "neuronxcc.nki.isa",
          "neuronxcc.nki.isa.constants", "neuronxcc.nki.typing", "neuronxcc.nki.compiler")


def _ours(mod) -> bool:
    return bool(getattr(mod, "__nki_sim__", False))


def is_installed() -> bool:
    """True when the simulator modules are currently registered as ``neuronxcc.nki``."""
    return _ours(sys.modules.get("neuronxcc.nki")) and _ours(sys.modules.get("neuronxcc"))


def real_nki_available() -> bool:
    """Whether a real, importable ``neuronxcc.nki`` exists on sys.path (placeholder = no)."""
    if importlib.machinery.PathFinder.find_spec("neuronxcc") is None:
        return False
    saved = {n: sys.modules.pop(n) for n in list(sys.modules)
             if (n == "neuronxcc" or n.startswith("neuronxcc.")) and _ours(sys.modules[n])}
    try:
        importlib.import_module("neuronxcc.nki")
        ok = not _ours(sys.modules.get("neuronxcc.nki"))
    except Exception:      # the PyPI placeholder raises ImportError; treat any failure as absent
        ok = False
    finally:
        if saved:
            for n in list(sys.modules):
                if n == "neuronxcc" or n.startswith("neuronxcc."):
                    del sys.modules[n]
            sys.modules.update(saved)
    if not ok:
        for n in list(sys.modules):
            if (n == "neuronxcc" or n.startswith("neuronxcc.")) and not _ours(sys.modules[n]):
                del sys.modules[n]
    return ok


def _modules() -> dict:
    from .legacy import compiler, isa, language, nki_api, nki_typing
    from .legacy.isa import constants
    root = types.ModuleType("neuronxcc", "nki_sim stand-in for the neuronxcc package")
    root.__nki_sim__ = True
    root.__path__ = []
    root.nki = nki_api
    for m in (nki_api, language, isa, constants, nki_typing, compiler):
        m.__nki_sim__ = True
    return {"neuronxcc": root, "neuronxcc.nki": nki_api, "neuronxcc.nki.language": language,
            "neuronxcc.nki.isa": isa, "neuronxcc.nki.isa.constants": constants,
            "neuronxcc.nki.typing": nki_typing, "neuronxcc.nki.compiler": compiler}


def real_root_available() -> bool:
    """Whether a real ``neuronxcc`` package (the compiler: not the PyPI placeholder, not ours)
    imports from sys.path, with or without its ``nki`` namespace (Neuron SDK 2.34 has none)."""
    if importlib.machinery.PathFinder.find_spec("neuronxcc") is None:
        return False
    mod = sys.modules.get("neuronxcc")
    if mod is not None:
        return not _ours(mod)
    try:
        mod = importlib.import_module("neuronxcc")
    except Exception:      # the placeholder raises on import: absent
        sys.modules.pop("neuronxcc", None)
        return False
    return not _ours(mod)


def install(force: bool = False) -> bool:
    """Register nki_sim as ``neuronxcc.nki`` and as ``nki`` (the current API, where no real
    ``nki`` is importable); returns True if it (re)installed the legacy modules. A real
    ``neuronxcc`` without ``nki`` (Neuron SDK 2.34, whose compiler the real ``nki``, torch-neuronx
    and the runtime use in-process) is left alone unless ``force``: registering the stand-in would
    replace that package in ``sys.modules``; the legacy API is then absent, as on that SDK."""
    install_current(force)
    if is_installed():
        return False
    if not force and (real_nki_available() or real_root_available()):
        return False
    for n in list(sys.modules):
        if n == "neuronxcc" or n.startswith("neuronxcc."):
            del sys.modules[n]
    sys.modules.update(_modules())
    return True


def uninstall() -> bool:
    """Remove the simulator's ``neuronxcc.*`` entries from sys.modules (for tests)."""
    removed = False
    for n in list(sys.modules):
        if (n == "neuronxcc" or n.startswith("neuronxcc.")) and _ours(sys.modules[n]):
            del sys.modules[n]
            removed = True
    return removed


# ---- the current API (``import nki``) ---------------------------------------------------------
def current_installed() -> bool:
    return _ours(sys.modules.get("nki"))


def real_current_nki_available() -> bool:
    """Whether a real, importable ``nki`` package exists on sys.path (placeholder = no)."""
    if importlib.machinery.PathFinder.find_spec("nki") is None:
        return False
    saved = {n: sys.modules.pop(n) for n in list(sys.modules)
             if (n == "nki" or n.startswith("nki.")) and _ours(sys.modules[n])}
    try:
        mod = importlib.import_module("nki")
        ok = not _ours(mod) and hasattr(mod, "jit")
    except Exception:      # the PyPI placeholder raises on import: absent
        ok = False
    finally:
        for n in list(sys.modules):
            if (n == "nki" or n.startswith("nki.")) and (saved or not ok):
                del sys.modules[n]
        sys.modules.update(saved)
    return ok


def install_current(force: bool = False) -> bool:
    """Register nki_sim's current front end as ``nki`` / ``nki.language`` / ``nki.isa`` ..."""
    if current_installed():
        return False
    if not force and real_current_nki_available():
        return False
    from .current import modules
    for n in list(sys.modules):
        if n == "nki" or n.startswith("nki."):
            del sys.modules[n]
    sys.modules.update(modules())
    return True


def uninstall_current() -> bool:
    removed = False
    for n in list(sys.modules):
        if (n == "nki" or n.startswith("nki.")) and _ours(sys.modules[n]):
            del sys.modules[n]
            removed = True
    return removed
