"""How the cache ops (``host.cache.cache_ops``, ``block_kv``, ``mla_cache``) run their kernels:
the API and LNC resolved and validated before anything is written (:func:`resolve_kernel_api`),
and the written rows taken from what a kernel returns (:func:`take_rows`,
``host._arrays.take_result``: on a device a kernel run with NumPy arguments returns the
updated cache instead of writing the caller's)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from host._arrays import take_result

__all__ = ["KernelRunner", "resolve_kernel_api", "take_rows"]


@dataclass(frozen=True)
class KernelRunner:
    """The API and LNC of a cache op, resolved and validated before anything is written:
    ``run(family, *args, **kwargs)`` runs a cache kernel on them (``nki_kernels.toolchain.Api.run``)."""

    api: Any
    lnc: Any = None

    def run(self, family: Any, *args: Any, **kwargs: Any) -> Any:
        return self.api.run(family, *args, lnc=self.lnc, **kwargs)


def resolve_kernel_api(api: Any, lnc: Any = None) -> KernelRunner:
    """``api`` and ``lnc`` resolved up front (``nki_kernels.toolchain.resolve_api`` and
    ``Api.lnc``: a ValueError naming a bad value, a NotImplementedError for two cores where
    they cannot run, e.g. on trn1)."""
    from nki_kernels.toolchain import resolve_api

    chosen = resolve_api(api)
    chosen.lnc(lnc, rows=True)          # the cache kernels: rows split (current), one program (legacy)
    return KernelRunner(chosen, lnc)


def take_rows(view: np.ndarray, out: Any, row_index: np.ndarray) -> None:
    """``take_result`` of a cache write: the rows ``row_index`` of ``view``, a row view of the
    cache whose second-to-last axis is the write kernel's rows (e.g. (2, N*Hkv*B, d), both
    halves); ``out``, the kernel's returned cache, is read through the same view, and rows past
    the view's end (padding, skipped by the kernel) wrote nothing."""
    rows = row_index.reshape(-1)
    rows = rows[rows < view.shape[-2]]
    take_result(view, None if out is None else np.asarray(out).reshape(view.shape),
                (slice(None),) * (view.ndim - 2) + (rows,))
