"""The simulated NKI release of the current front end: 0.6 (SDK 2.32), 0.7 (2.33), 0.8 (2.34).

Per thread, like every simulator switch: ``with nki_sim.current.use_nki_version("0.6"): ...``;
process-wide default from env ``NKI_SIM_NKI_VERSION`` (else 0.8).  Differences modelled
(reference §1, §4.4): registers and ``nl.dynamic_range`` up to 0.6 / 0.7 (registers deprecated
with a ``DeprecationWarning`` in 0.8; ``dynamic_range`` removed in 0.7), ``scalar_load`` /
``NkiScalar`` from 0.7, the ``fori_loop`` induction value (register in 0.6, ``NkiScalar`` from 0.7),
``nl.if_else``, ``fori_loop(unroll=)`` and ``nki.lnc`` from 0.8 (``sendrecv`` in ``nki.isa`` before),
``jit(compile_config=, specialization_config=)`` from 0.7.
"""

from __future__ import annotations

import contextlib
import os
import threading

VERSIONS = {(0, 6): "2.32", (0, 7): "2.33", (0, 8): "2.34"}
DEFAULT = (0, 8)


def parse(v) -> tuple:
    if isinstance(v, tuple):
        t = tuple(int(x) for x in v[:2])
    else:
        s = str(v).strip()
        try:
            t = tuple(int(x) for x in s.split(".")[:2])
        except ValueError:
            t = ()
    if t not in VERSIONS:
        raise ValueError(f"NKI version must be one of 0.6, 0.7, 0.8; got {v!r}")
    return t


class _Local(threading.local):
    def __init__(self):
        self.stack = []


_local = _Local()
_env = os.environ.get("NKI_SIM_NKI_VERSION", "").strip()
_default = [parse(_env) if _env else DEFAULT]


def current() -> tuple:
    """(major, minor) simulated by the calling thread."""
    return _local.stack[-1] if _local.stack else _default[0]


def has(v: tuple) -> bool:
    return current() >= v


def set_default(v) -> None:
    """Process-wide default NKI version (threads without a ``use_nki_version`` block)."""
    _default[0] = parse(v)


@contextlib.contextmanager
def use_nki_version(v):
    _local.stack.append(parse(v))
    try:
        yield current()
    finally:
        _local.stack.pop()


def fmt(v=None) -> str:
    v = current() if v is None else v
    return f"{v[0]}.{v[1]}"


def require(v: tuple, what: str) -> None:
    if not has(v):
        from ..errors import NotEmulatedError
        raise NotEmulatedError(f"{what} needs NKI {fmt(v)} (Neuron SDK {VERSIONS[v]}); the simulated "
                               f"NKI is {fmt()}")
