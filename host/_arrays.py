"""NumPy / torch interchange for the host layer (torch is optional and imported lazily).

Every public host function accepts NumPy arrays, Python sequences, or torch tensors, works in
NumPy, and hands torch tensors back when the caller passed torch. torch is only imported when a
torch tensor is actually seen, so the host layer works on machines without torch.

    arr, was_torch = to_numpy(x, "query")
    ...
    return from_numpy_like(result, was_torch, like=x)
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["is_torch_tensor", "to_numpy", "from_numpy_like", "readonly", "take_result"]


def is_torch_tensor(x: Any) -> bool:
    """True if ``x`` is a torch.Tensor, decided without importing torch."""
    mod = type(x).__module__ or ""
    return (mod == "torch" or mod.startswith("torch.")) and hasattr(x, "detach") and hasattr(x, "dtype")


def to_numpy(x: Any, name: str) -> tuple[np.ndarray, bool]:
    """Convert ``x`` to a NumPy array; return ``(array, was_torch)``.

    torch tensors are detached and moved to the CPU; torch.bfloat16 / float8_e4m3fn / float8_e5m2
    become the ml_dtypes types (bit-exact, via an integer view). Lists, tuples and scalars go through ``np.asarray``.
    ``name`` is the argument name used in the error message if the conversion fails.
    """
    if is_torch_tensor(x):
        import torch  # lazy: only when the caller actually uses torch

        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if t.dtype == torch.bfloat16:
            import ml_dtypes

            return t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16), True
        if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):    # bit-exact, via a uint8 view
            import ml_dtypes

            fp8 = getattr(ml_dtypes, str(t.dtype).removeprefix("torch."))
            return t.contiguous().view(torch.uint8).numpy().view(fp8), True
        return t.numpy(), True
    if isinstance(x, np.ndarray):
        return x, False
    try:
        return np.asarray(x), False
    except (TypeError, ValueError) as e:  # ragged lists etc.
        raise ValueError(f"{name} must be array-like (NumPy array, sequence or torch tensor); "
                         f"got {type(x).__name__}") from e


def from_numpy_like(arr: np.ndarray, was_torch: bool, like: Any = None) -> Any:
    """Return ``arr`` unchanged, or as a torch tensor on ``like``'s device when ``was_torch``."""
    if not was_torch:
        return arr
    import torch

    a = np.ascontiguousarray(arr)
    if a.dtype.name == "bfloat16":
        t = torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    else:
        # torch.from_numpy refuses read-only arrays; copy those.
        t = torch.from_numpy(a if a.flags.writeable else a.copy())
    if like is not None and is_torch_tensor(like) and like.device.type != "cpu":
        t = t.to(like.device)
    return t


def readonly(arr: np.ndarray) -> np.ndarray:
    """Mark ``arr`` read-only in place and return it (used for arrays stored in frozen plans)."""
    arr.setflags(write=False)
    return arr


def take_result(dst: np.ndarray, out: Any, index: Any) -> None:
    """Make ``dst[index]`` hold ``out[index]``: ``out`` is the array a cache kernel returned for
    ``dst`` (same shape and dtype: the view the kernel saw), ``index`` the elements the op wrote
    (its destination rows or blocks). The simulator updates its arguments in place and returns
    them (the same memory: nothing to do); a kernel run on a device with NumPy arguments returns
    the updated array, of which only ``index`` is copied, so what other threads wrote elsewhere
    in the same cache meanwhile survives. ValueError if the shapes or dtypes differ."""
    if out is None:
        return
    out = np.asarray(out)
    if np.may_share_memory(out, dst):
        return
    if out.shape != dst.shape or out.dtype != dst.dtype:
        raise ValueError(f"a kernel's result {out.shape} {out.dtype} must match its destination "
                         f"{dst.shape} {dst.dtype}")
    dst[index] = out[index]
