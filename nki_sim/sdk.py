"""Neuron SDK version gating of the legacy API (NKI release notes, general/nki/nki_rn.rst).

The simulated SDK is ``nki_sim.config.sdk`` (default 2.24, the newest release of the
2.21-2.24 generation this project targets; env ``NKI_SIM_SDK=2.26`` or
``nki_sim.configure(sdk=(2, 26))`` to change it).  A name added after the configured
release is absent (``AttributeError``, like the real module), and a keyword added later
raises ``TypeError`` (unexpected keyword), so a kernel that only compiles on a newer SDK
fails here too.
"""

from __future__ import annotations

from .config import config

MIN_SDK, MAX_SDK = (2, 21), (2, 26)

# module-level names: (module, name) -> first SDK release that has it.  (The enums oob_mode,
# dge_mode, reduce_cmd and engine stay importable; the keywords that use them are gated.)
NAMES = {
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


def parse(v) -> tuple:
    """(major, minor) from "2.24", 2.24 or (2, 24); ValueError outside 2.21-2.26."""
    if isinstance(v, str):
        parts = v.strip().split(".")
    elif isinstance(v, float):
        parts = f"{v:.2f}".split(".")
    else:
        parts = list(v)
    try:
        t = (int(parts[0]), int(parts[1]))
    except (ValueError, IndexError, TypeError):
        raise ValueError(f"sdk must look like '2.24' or (2, 24); got {v!r}") from None
    if not MIN_SDK <= t <= MAX_SDK:
        raise ValueError(f"sdk must be a legacy-NKI Neuron SDK release between 2.21 and 2.26; got {v!r}")
    return t


def fmt(t) -> str:
    return f"{t[0]}.{t[1]}"


def has(version) -> bool:
    return tuple(config.sdk) >= tuple(version)


def lookup(module: str, name: str, table: dict):
    """Serve a gated module attribute, or raise the AttributeError the real module would."""
    need = NAMES.get((module, name))
    if need is not None and name in table:
        if has(need):
            return table[name]
        raise AttributeError(
            f"module 'neuronxcc.nki.{module}' has no attribute '{name}' (added in Neuron SDK "
            f"{fmt(need)}; nki_sim simulates SDK {fmt(config.sdk)}: nki_sim.configure(sdk=...) or "
            "env NKI_SIM_SDK)")
    return None


def check_kwargs(api: str, version, **given) -> None:
    """TypeError for keywords (given with a non-None value) newer than the simulated SDK."""
    if has(version):
        return
    for k, v in given.items():
        if v is not None:
            raise TypeError(
                f"{api}() got an unexpected keyword argument '{k}' (added in Neuron SDK "
                f"{fmt(version)}; nki_sim simulates SDK {fmt(config.sdk)})")


def module_getattr(module: str, short: str, namespace: dict, not_emulated: set):
    """A PEP 562 ``__getattr__`` for nki_sim.language / nki_sim.isa.

    Moves the SDK-gated names out of ``namespace`` (so ``hasattr`` / ``from ... import`` follow
    the simulated SDK), names real-but-not-emulated NKI APIs with ``NotImplementedError``, and
    raises ``AttributeError`` for anything else.
    """
    from .errors import not_emulated as _not_emulated
    gated = {name: namespace.pop(name) for (mod, name) in NAMES if mod == module}

    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        got = lookup(module, name, gated)
        if got is not None:
            return got
        if name in not_emulated:
            raise _not_emulated(f"{short}.{name}")
        raise AttributeError(f"module 'neuronxcc.nki.{module}' (nki_sim) has no attribute {name!r}")
    return __getattr__
