"""Neuron SDK version gating of the legacy API (NKI release notes, general/nki/nki_rn.rst).

The simulated SDK is ``nki_sim.config.sdk`` (per thread, like every switch): a release between 2.21 (the project's floor) and
2.27 (the last release that ships the legacy ``neuronxcc.nki`` namespace), default 2.24;
change it with ``nki_sim.configure(sdk="2.26")`` or env ``NKI_SIM_SDK``.  A name added after
the simulated release is absent from ``nl`` / ``nisa`` (``AttributeError``, like the real
module), and a keyword added later raises ``TypeError`` (unexpected keyword), so a kernel that
only compiles on a newer SDK fails here too.  No legacy-API additions of 2.27 are modelled (it
is treated as 2.26).
"""

from __future__ import annotations

import sys
import types

from .config import config
from .errors import not_emulated as _not_emulated
from .versions import MAX_SDK, MIN_SDK, fmt, parse  # noqa: F401  (the SDK release numbers)


# module-level names: (module, name) -> first SDK release that has it
NAMES = {
    ("isa", "oob_mode"): (2, 23),
    ("isa", "dge_mode"): (2, 23),
    ("isa", "reduce_cmd"): (2, 22),
    ("isa", "engine"): (2, 22),
    ("isa", "select_reduce"): (2, 26),
    ("isa", "range_select"): (2, 23),
    ("isa", "tensor_copy_predicated"): (2, 22),
    ("language", "gather_flattened"): (2, 24),
    ("language", "gelu_apprx_sigmoid"): (2, 26),
    ("language", "mod"): (2, 22),
    ("language", "fmod"): (2, 22),
    ("language", "reciprocal"): (2, 22),
    ("language", "broadcast_to"): (2, 22),
    ("language", "empty_like"): (2, 22),
}


def has(version) -> bool:
    return tuple(config.sdk) >= tuple(version)


def check_kwargs(api: str, version, **given) -> None:
    """TypeError for keywords (given with a non-None value) newer than the simulated SDK."""
    for v in given.values():
        if v is not None:
            break
    else:
        return
    if has(version):
        return
    for k, v in given.items():
        if v is not None:
            raise TypeError(
                f"{api}() got an unexpected keyword argument '{k}' (added in Neuron SDK "
                f"{fmt(version)}; nki_sim simulates SDK {fmt(config.sdk)})")


_REGISTRY: dict = {}      # module name -> (namespace dict, {gated name: object})
_hidden: set = set()      # (module, name) of gated names deleted with delattr (monkeypatch)


def visible(module: str, name: str) -> bool:
    """Whether gated ``name`` of ``module`` exists for the calling thread's simulated SDK."""
    return (module, name) not in _hidden and has(NAMES[(module, name)])


def sync() -> None:
    """Kept for compatibility: gated names are resolved per thread on attribute access."""


class _GatedModule(types.ModuleType):
    """Module type of nki_sim.language / nki_sim.isa: assignment and deletion of SDK-gated names.

    Gated names never live in the module namespace; the module ``__getattr__`` serves them when
    the calling thread's simulated SDK has them.  ``setattr`` of a gated name to another object
    (or to the real one while the SDK lacks it) shadows it for every thread; ``delattr`` makes
    it absent; setting the real object back restores SDK gating (what ``monkeypatch.undo`` does).
    """

    def __setattr__(self, name, value):
        gate = self.__dict__.get("_sdk_gate")
        if gate is not None and name in gate[1]:
            module, gated = gate
            _hidden.discard((module, name))
            if value is gated[name] and has(NAMES[(module, name)]):
                self.__dict__.pop(name, None)
                return
        super().__setattr__(name, value)

    def __delattr__(self, name):
        gate = self.__dict__.get("_sdk_gate")
        if gate is None or name not in gate[1]:
            super().__delattr__(name)
            return
        module = gate[0]
        if name in self.__dict__:
            super().__delattr__(name)
            if has(NAMES[(module, name)]):
                _hidden.add((module, name))
        elif visible(module, name):
            _hidden.add((module, name))
        else:
            raise AttributeError(name)


def module_getattr(module: str, short: str, namespace: dict, not_emulated: set):
    """A PEP 562 ``__getattr__`` for nki_sim.language / nki_sim.isa.

    The SDK-gated names are taken out of the module namespace and served by this
    ``__getattr__`` only while the calling thread's simulated SDK has them, so ``hasattr``,
    ``from ... import`` and monkeypatching (see :class:`_GatedModule`) behave like the real
    module, per thread; it explains an absent gated name, names real-but-not-emulated NKI
    APIs with ``NotImplementedError``, and raises ``AttributeError`` for anything else.
    """
    gated = {name: namespace.pop(name) for (mod, name) in NAMES if mod == module}
    _REGISTRY[module] = (namespace, gated)
    namespace["_sdk_gate"] = (module, gated)
    mod = sys.modules[namespace["__name__"]]
    mod.__class__ = _GatedModule

    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        need = NAMES.get((module, name))
        if need is not None:
            if (module, name) not in _hidden and has(need):
                return gated[name]
            raise AttributeError(
                f"module 'neuronxcc.nki.{module}' has no attribute '{name}' (added in Neuron SDK "
                f"{fmt(need)}; nki_sim simulates SDK {fmt(config.sdk)}: nki_sim.configure(sdk=...) or "
                "env NKI_SIM_SDK)")
        if name in not_emulated:
            raise _not_emulated(f"{short}.{name}")
        raise AttributeError(f"module 'neuronxcc.nki.{module}' (nki_sim) has no attribute {name!r}")

    def __dir__():
        return sorted(set(namespace) | {n for n in gated if visible(module, n)})
    namespace["__dir__"] = __dir__
    return __getattr__
