"""``neuronxcc.nki.compiler``: direct-allocation objects accepted as ``buffer=`` (addresses ignored)."""

from __future__ import annotations

import contextlib


class _Alloc:
    def __init__(self, kind, **kw):
        self._nki_sim_buffer = kind
        self.options = kw


class _Space:
    def __init__(self, kind):
        self.kind = kind

    def mod_alloc(self, *args, **kwargs):
        return _Alloc(self.kind, **kwargs)

    def alloc(self, func=None, **kwargs):
        return _Alloc(self.kind, func=func, **kwargs)

    def auto_alloc(self, *args, **kwargs):
        return _Alloc(self.kind, **kwargs)

    @property
    def _nki_sim_buffer(self):
        return self.kind


sbuf = _Space("sbuf")
psum = _Space("psum")


def _identity_decorator(func=None, **kwargs):
    if func is None:
        return lambda f: f
    return func


skip_middle_end_transformations = _identity_decorator
enable_stack_allocator = _identity_decorator
force_auto_alloc = _identity_decorator


def multi_buffer(*args, **kwargs):
    return contextlib.nullcontext()


def no_reorder(*args, **kwargs):
    return contextlib.nullcontext()


def allocation_scope(*args, **kwargs):
    return contextlib.nullcontext()
