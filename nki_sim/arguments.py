"""Kernel arguments and results across the launch boundary (front-end neutral).

One definition, used by both front ends' launches (:mod:`nki_sim.runtime` for the legacy API,
:mod:`nki_sim.current.launch` for the current one), of:

* :func:`to_numpy`: a kernel argument as a NumPy array.  NumPy arrays pass as they are; CPU torch
  tensors (``nki.jit`` detects the framework from its arguments: the legacy ``mode="auto"``, the
  current "torch.Tensor: uses PyTorch integration") become NumPy arrays sharing their storage
  where torch allows (bf16 through an int16 view); torch tensors on another device and JAX
  arrays are rejected.
* :func:`check_dtype`: the NKI dtype rule for arguments (``ValueError`` naming the argument).
* :func:`input_alloc`: the HBM allocation of an array argument (the caller's memory when it can
  be, else a contiguous copy; a read-only view for an immutable input).
* :func:`write_back`: copy a kernel-written HBM array into the caller's array / tensor; a
  read-only NumPy array that the kernel wrote is a ``ValueError`` naming the argument, one it
  only read needs no write-back.
* :func:`materialize` / :func:`to_framework`: a returned tensor view as a fresh NumPy array, and
  that array as a torch tensor when the arguments were torch tensors.
"""

from __future__ import annotations

import numpy as np

from . import dtypes as D
from .access import Access
from .memory import Alloc


def _is_torch(x) -> bool:
    return type(x).__module__.split(".")[0] == "torch" and hasattr(x, "detach")


def to_numpy(name: str, x):
    """``(array, torch_tensor)`` of a kernel argument: ``(x, None)`` for a NumPy array,
    ``(view, x)`` for a CPU torch tensor (a NumPy view of its storage when it is contiguous, a
    copy otherwise), ``(None, None)`` for anything else (passed to the kernel unchanged)."""
    if isinstance(x, np.ndarray):
        return x, None
    if _is_torch(x):
        import torch
        t = x.detach()
        if t.device.type != "cpu":
            raise ValueError(f"kernel argument '{name}' is a torch tensor on {t.device}; the "
                             "simulator runs on CPU tensors (move it with .cpu())")
        t = t.contiguous()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(D.bfloat16), x
        return t.numpy(), x
    if type(x).__module__.split(".")[0] in ("jax", "jaxlib"):
        raise TypeError(f"kernel argument '{name}' is a JAX array; the simulator takes NumPy "
                        "arrays or torch tensors (AWS's simulator does not support JAX either)")
    return None, None


def check_dtype(name: str, dtype) -> None:
    """``ValueError`` unless ``dtype`` is an NKI dtype (float64 / int64 ... are rejected)."""
    if np.dtype(dtype) not in D.SUPPORTED:
        raise ValueError(
            f"kernel argument '{name}' must have an NKI dtype (float32, float16, bfloat16, fp8, "
            f"(u)int8/16/32, bool); got {np.dtype(dtype).name}. Cast it on the host first.")


def input_alloc(name: str, arr: np.ndarray, buffer: str, *, mutable: bool, user) -> Alloc:
    """The HBM allocation of array argument ``name`` (``user``: the caller's object, ``arr`` or
    the torch tensor it views).  A mutable input writes the caller's memory directly when it is
    C-contiguous and writable, a contiguous copy otherwise (:func:`write_back` returns the
    result); an immutable one is a read-only view."""
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if mutable:
        data = arr if arr.flags.c_contiguous and arr.flags.writeable else np.ascontiguousarray(arr).copy()
    else:
        data = np.ascontiguousarray(arr).view()
        data.flags.writeable = False
    a = Alloc(data, buffer, name=name, kind="input", written=True, mutable=mutable)
    a.user_array = user
    return a


def writable(name: str, user) -> None:
    """``ValueError`` if the kernel wrote argument ``name`` but the caller's NumPy array is
    read-only (the result could not be returned in place)."""
    if isinstance(user, np.ndarray) and not user.flags.writeable:
        raise ValueError(
            f"kernel argument '{name}' is written by the kernel, but the array passed is read-only "
            "(flags.writeable is False); pass a writable array (e.g. arr.copy())")


def write_back(name: str, user, data: np.ndarray, written: bool = True) -> None:
    """Copy ``data`` (the kernel's HBM storage of argument ``name``) into the caller's object
    ``user`` (a NumPy array or a torch tensor) unless both are the same memory.  A read-only
    NumPy ``user`` is left alone when the kernel neither ``written`` the argument nor changed its
    bytes (a dtype view of it may write without marking it), and is a ``ValueError`` otherwise."""
    if _is_torch(user):
        import torch
        src = torch.from_numpy(np.ascontiguousarray(data).view(np.int16)).view(torch.bfloat16) \
            if data.dtype == D.bfloat16 else torch.from_numpy(np.ascontiguousarray(data))
        with torch.no_grad():
            if user.data_ptr() != src.data_ptr():
                user.copy_(src.reshape(user.shape))
        return
    if data is user:
        return
    if not user.flags.writeable:
        if not written and np.array_equal(np.ascontiguousarray(user).reshape(-1).view(np.uint8),
                                          data.reshape(-1).view(np.uint8)):
            return
        writable(name, user)
    np.copyto(user, data.reshape(user.shape))


def materialize(x) -> np.ndarray:
    """A fresh NumPy array holding the elements of core tensor view ``x`` (basic or advanced),
    never-written elements poisoned first."""
    x.alloc.poison()
    if x.idx is None:
        return np.array(x.arr)
    return np.array(Access(x).gather(x.alloc.data))


def to_framework(arr: np.ndarray, torch_out: bool):
    """``arr`` as returned to the caller: the NumPy array, or a torch tensor if ``torch_out``."""
    if not torch_out:
        return arr
    import torch
    if arr.dtype == D.bfloat16:
        return torch.from_numpy(arr.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(arr))
