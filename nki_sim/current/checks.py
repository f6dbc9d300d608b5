"""Hardware / API constraint checks of the current front end, with AWS's simulator texts.

AWS's ``nki.simulate`` raises ``AssertionError`` with texts such as
``tensor_tensor data1 partition dimension 256 exceeds maximum 128`` and
``dst must be in ['psum'], got sbuf`` (reference §5); :class:`NkiValidationError` (also exported as
``nisa.NkiValidationError``) is an ``AssertionError`` carrying those texts.  Checks that go beyond
AWS's simulator (capacity, DGE rules, PSUM accumulate provenance, dtype rules) use the same class.
"""

from __future__ import annotations

import math

from .. import errors as E
from ..state import state
from .tensor import TensorBase as NkiTensor, is_hbm


class NkiValidationError(E.NkiSimError, AssertionError):
    """Raised when hardware constraints are violated (``nisa.NkiValidationError``)."""


def require_kernel(api: str):
    """NKI calls outside a kernel are errors."""
    if state.kernel is None:
        raise E.NkiCompileError(f"'{api}' called outside of an NKI kernel; call it from a function "
                                "launched by nki.jit / nki.simulate")


def fail(msg: str):
    raise NkiValidationError(msg)


def tile(x, op: str, pname: str) -> NkiTensor:
    if not isinstance(x, NkiTensor):
        raise TypeError(f"{op}: {pname} must be an nl.ndarray (tensor view); got {type(x).__name__}")
    return x


def partitions(op: str, pname: str, t, limit: int = 128):
    if isinstance(t, NkiTensor) and t.onchip and t.shape and t.shape[0] > limit:
        fail(f"{op} {pname} partition dimension {t.shape[0]} exceeds maximum {limit}")


def buffer_in(op_pname: str, t: NkiTensor, allowed):
    """``dst must be in ['psum'], got sbuf``."""
    b = "hbm" if is_hbm(t) else t._alloc.buffer
    if b not in allowed:
        fail(f"{op_pname} must be in {list(allowed)}, got {b}")


def same_elements(op: str, dst: NkiTensor, src: NkiTensor):
    if dst.size != src.size:
        fail(f"{op} requires src and dst to have the same number of elements, got src={src.size}, "
             f"dst={dst.size}")


def same_partition_layout(op: str, named):
    """Same partition count and same elements per partition (tensor_tensor / tensor_copy ...)."""
    tiles = [(n, t) for n, t in named if isinstance(t, NkiTensor)]
    if not tiles:
        return
    p0 = tiles[0][1].shape[0]
    f0 = math.prod(tiles[0][1].shape[1:])
    for n, t in tiles[1:]:
        if t.shape[0] != p0 or math.prod(t.shape[1:]) != f0:
            desc = ", ".join(f"{m}{list(x.shape)}" for m, x in tiles)
            fail(f"{op}: operands must have the same partition count and elements per partition; "
                 f"got {desc}")


def no_broadcast(op: str, a, b):
    """``nl`` binary ops do not broadcast (documented known issue: (128,1) + (128,512))."""
    if isinstance(a, NkiTensor) and isinstance(b, NkiTensor) and a.shape != b.shape:
        raise E.NotEmulatedError(
            f"nl.{op}: operands of shapes {list(a.shape)} and {list(b.shape)} need broadcasting, which "
            "the current nl binary ops do not support ((128,1) + (128,512) is not yet supported); use "
            "nisa.tensor_scalar with a [P, 1] operand, or a .broadcast() view")


def check_vector_offset(base: NkiTensor, index, indirect_dim):
    """``vector_offset``: an SBUF integer index tile ``(P, 1)`` indexing dim 0 of an HBM tensor."""
    if indirect_dim != 0:
        fail(f".ap: vector_offset only supports indirect_dim=0; got indirect_dim={indirect_dim}")
    if not is_hbm(base):
        fail(f".ap: vector_offset needs the indexed tensor in HBM; `{base.name}` is in "
             f"{base._alloc.buffer}")
    if not isinstance(index, NkiTensor) or index._alloc.buffer != "sbuf":
        where = index._alloc.buffer if isinstance(index, NkiTensor) else type(index).__name__
        fail(f".ap: vector_offset must be an index tile in SBUF; got {where}")
    if not index.dtype.startswith(("int", "uint")):
        fail(f".ap: vector_offset must be an integer tile (uint32 / int32); got {index.dtype}")


def onchip_rank(t: NkiTensor):
    if t.onchip and t.ndim < 2:
        fail("SBUF and PSUM tensors must have at least 2 dimensions (partition-dim and free-dim)")


def check_capacity(live, target) -> None:
    """When a program ends: its live on-chip tensors (``memory.Live``: each from its allocation to
    its last access) must fit ``target``'s usable SBUF and its PSUM, else the error names the
    tensor whose allocation reached the peak."""
    for buf, (peak, name) in live.finish(target).items():
        cap = (target.sbuf_usable_bytes_per_partition if buf == "sbuf"
               else target.psum_bytes_per_partition)
        if peak > cap:
            fail(f"{buf.upper()} capacity exceeded: with `{name}` allocated, the {buf} tensors still "
                 f"to be accessed take {peak} bytes per partition; {target.name} has {cap}")
