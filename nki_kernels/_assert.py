"""The one input-check helper used inside kernels.

Kernels run their Python body at trace time (real NKI) or eagerly (``nki_sim``);
in both cases shapes, dtypes and keyword arguments are plain Python values, so a
check is an ordinary ``if``. All kernels word their errors through these two
functions so messages read the same everywhere:

    ValueError("flash_paged_attention: query.shape[2] (head size d) must be <= 128; got 256")
    NotImplementedError("flash_paged_attention: fp8 KV cache is not supported; cast the cache to bf16 first")
"""

from __future__ import annotations


def kernel_check(cond: bool, kernel: str, arg: str, constraint: str, got) -> None:
    """Raise ``ValueError`` naming the argument, the constraint and the value received."""
    if not cond:
        raise ValueError(f"{kernel}: {arg} must {constraint}; got {got!r}")


def kernel_unsupported(cond: bool, kernel: str, what: str, instead: str) -> None:
    """Raise ``NotImplementedError`` for a valid but unsupported request, saying what to do instead."""
    if not cond:
        raise NotImplementedError(f"{kernel}: {what} is not supported; {instead}")
