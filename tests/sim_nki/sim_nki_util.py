"""Helpers of the current-API simulator tests: small tile / output shortcuts for kernels."""

from __future__ import annotations

import nki_sim

nki_sim.install()

import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402


def sb(shape, dtype="float32", buffer=None):
    return nl.ndarray(shape, dtype, buffer=buffer or nl.sbuf)


def load(src, dtype=None):
    t = sb(src.shape, dtype or src.dtype)
    nisa.dma_copy(dst=t, src=src)
    return t


def out_of(t, dtype=None):
    """Store on-chip tile ``t`` into a new shared_hbm output."""
    o = nl.ndarray(t.shape, dtype or t.dtype, buffer=nl.shared_hbm)
    if t.buffer == nl.psum:
        s = sb(t.shape, t.dtype)
        nisa.tensor_copy(dst=s, src=t)
        t = s
    nisa.dma_copy(dst=o, src=t)
    return o


__all__ = ["nki", "nl", "nisa", "sb", "load", "out_of"]
