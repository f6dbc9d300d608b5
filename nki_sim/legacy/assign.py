"""Legacy tensor assignment: ``t[key] = value`` and ``t += value`` (``neuronxcc.nki`` semantics).

In the legacy API an op returns a fresh result tile; assigning it to a view makes that view the
op's destination (the values are copied with the cast to the destination dtype, no extra
instruction unless a TensorE result lands outside PSUM, where the compiler adds the PSUM -> SBUF
evacuation copy).  Assigning an existing tile is a VectorE copy, a scalar a memset.
``psum += <TensorE result>`` accumulates in fp32.  The engine / memory rules of the producing
instruction are checked here (TensorE writes PSUM only, GpSimd never touches PSUM, matmul
results in PSUM are fp32 on NeuronCore-v2/v3).
"""

from __future__ import annotations

import warnings

import numpy as np

from .. import dtypes as D
from .. import errors as E
from .. import trace
from ..access import fit_value, read, write
from ..indexing import IndexExpr
from ..state import state
from ..target import get_target
from ..tensor import Tensor
from .language import elementwise


def _same_region(a: Tensor, b: Tensor) -> bool:
    if not (a.alloc is b.alloc and a.shape == b.shape and a.arr.shape == b.arr.shape
            and a.elem_layout() == b.elem_layout()):
        return False
    if a.idx is None or b.idx is None:
        return a.idx is None and b.idx is None
    return len(a.idx) == len(b.idx) and all(
        np.array_equal(x, y) for x, y in zip(a.idx, b.idx))


# ISA-level TensorE instructions whose result may not be assigned outside PSUM. A TensorE
# nc_transpose result assigned to SBUF is accepted with the PSUM -> SBUF copy the legacy front
# end inserts (AWS's SD-attention tutorial, nki-samples' flash_attn_bwd; nki_sim/README.md
# rule 6); an nc_matmul result stays PSUM-only.
_PSUM_ONLY = ("nc_matmul",)


def _check_psum_acc_dtype(value: Tensor, dst: Tensor, op: str):
    """Matmul results land in PSUM as fp32 on NeuronCore-v2/v3 (bf16 PSUM only from v4)."""
    if (value.producer or ("", ""))[1] in ("matmul", "nc_matmul") and dst.buffer == "psum" \
            and value.dtype == D.float32 and dst.dtype not in (D.float32, D.int32):
        raise E.DtypeError(
            f"'{op}' result written into PSUM tensor {dst.name} of dtype {dst.dtype.name}: matmul "
            "results in PSUM must be float32 on NeuronCore-v2/v3; allocate the PSUM tile as float32 "
            "and cast when copying it to SBUF")


def _check_pe_transpose_psum(value: Tensor, dst: Tensor):
    """PE-array transposes write PSUM as fp32 on NeuronCore-v2 and in the source dtype on v3
    (AWS kernels: psum_dtype = src.dtype if gen3 else float32)."""
    prod = value.producer or ()
    if len(prod) < 3 or prod[:2] != ("tensor", "nc_transpose") or dst.buffer != "psum":
        return
    src = prod[2]
    if get_target().nc_version == "gen2":
        if dst.dtype != D.float32:
            raise E.DtypeError(
                f"nisa.nc_transpose on the Tensor Engine writes PSUM as float32 on NeuronCore-v2; "
                f"destination {dst.name} is {dst.dtype.name} (allocate the PSUM tile as float32)")
    elif dst.dtype != src:
        warnings.warn(
            f"nisa.nc_transpose of a {np.dtype(src).name} tile into {dst.dtype.name} PSUM tensor "
            f"{dst.name}: on NeuronCore-v3 PE-array outputs must match the input dtype",
            RuntimeWarning, stacklevel=4)


def _check_producer(value: Tensor, dst: Tensor):
    """The instruction that made ``value`` writes ``dst`` directly: check its engine's memories."""
    _check_pe_transpose_psum(value, dst)
    eng, op = (value.producer or ("", ""))[:2]
    if eng == "tensor" and op in _PSUM_ONLY and dst.buffer != "psum":
        raise E.MemorySpaceError(
            f"the Tensor Engine writes PSUM only: result of 'nisa.{op}' assigned to {dst.buffer} "
            f"tensor {dst.name}; assign it to a PSUM tile (then nl.copy / nisa.tensor_copy to SBUF)")
    _check_psum_acc_dtype(value, dst, op)
    if eng == "gpsimd" and dst.buffer == "psum":
        raise E.MemorySpaceError(
            f"the GpSimd engine cannot access PSUM: result of '{op}' assigned to PSUM tensor "
            f"{dst.name}; assign it to an SBUF tile")


def _emit_copy(src: Tensor, dst: Tensor, implicit: bool = False):
    trace.emit("vector", "copy", in_shapes=(src.shape,), out_shape=dst.shape,
               in_dtypes=(src.dtype,), out_dtype=dst.dtype,
               partitions=dst.shape[0] if dst.shape else 1,
               free_elems=dst.size // max(1, dst.shape[0]) if dst.shape else 1,
               nbytes=dst.size * dst.itemsize, attrs={"implicit": True} if implicit else {},
               src_buffer=src.buffer, dst_buffer=dst.buffer, reads=(src.alloc.id,),
               writes=dst.alloc.id)


def assign(t: Tensor, key, value) -> None:
    """``t[key] = value``: a copy instruction (or the destination of the op that made value)."""
    dst = t[key]
    if getattr(value, "nki_loop_reduce", False):        # acc[...] = nl.loop_reduce(x, ...)
        value.assign_into(dst)
        return
    if isinstance(value, Tensor):
        if value.fresh == "acc" and _same_region(dst, value):
            return
        if not dst.onchip or not value.onchip:
            raise E.MemorySpaceError(
                f"assignment between {value.buffer} tensor {value.name} and {dst.buffer} tensor "
                f"{dst.name}: use nl.load / nl.store / nisa.dma_copy to move data to or from HBM")
        if value.fresh:
            _check_producer(value, dst)
            pm = value.pmask
            vals, _ = read(value, pm, op="assign")
            m = None if pm is None else fit_value(pm, dst.shape)
            write(dst, vals, m, op="assign")
            value.fresh = False
            if state.traces:
                trace.note_write(dst.alloc.id, value.alloc.id, dst.buffer, tuple(dst.shape),
                                 dst.itemsize)
            if (value.producer or ("",))[0] == "tensor" and dst.buffer != "psum":
                # TensorE writes PSUM: the compiler adds the PSUM -> SBUF evacuation copy
                _emit_copy(value, dst, implicit=True)
            return
        vals, _ = read(value, op="copy")
        write(dst, vals, op="copy")
        _emit_copy(value, dst)
        return
    if isinstance(value, IndexExpr):
        raise TypeError("cannot assign an nl.arange / nl.mgrid index to a tensor "
                        "(err_cannot_assign_to_index); convert it with nisa.iota first")
    if isinstance(value, (bool, int, float, np.number, np.bool_)):
        if not dst.onchip:
            raise E.MemorySpaceError(f"scalar assignment to {dst.buffer} tensor {dst.name}: use nl.store")
        write(dst, np.asarray(value), op="memset")
        trace.emit("vector", "memset", out_shape=dst.shape, out_dtype=dst.dtype,
                   partitions=dst.shape[0] if dst.shape else 1,
                   free_elems=dst.size // max(1, dst.shape[0]) if dst.shape else 1,
                   nbytes=dst.size * dst.itemsize, writes=dst.alloc.id)
        return
    raise TypeError(f"cannot assign a {type(value).__name__} to NKI tensor {t.name}; "
                    "assign a tile, a scalar, or the result of an nl/nisa op")


_REDUCTIONS = ("add", "subtract", "multiply", "divide")     # +=, -=, *=, /=


def inplace_update(t: Tensor, other, fname: str) -> Tensor:
    """``t += other`` etc.  ``psum += <TensorE result>`` accumulates in fp32; everything else is
    ``t[...] = t <op> other``. In-place operators are reductions, which the ``affine_range``
    documentation does not count as loop-carried dependencies (and NKI 2.23 made ``+=, -=, /=,
    *=`` "work consistently across loop types, PSUM, and SBUF"): their write is exempt from the
    dependency check; the explicit ``t[...] = nl.add(t, x)`` stays checked."""
    if (fname == "add" and isinstance(other, Tensor) and other.fresh == "pe"
            and t.buffer == "psum"):
        _check_psum_acc_dtype(other, t, "matmul accumulate")
        # a masked matmul accumulates only its unmasked (written) elements into PSUM
        pm = other.pmask
        m = pm if pm is not None and pm.shape == tuple(other.shape) == tuple(t.shape) else None
        vals, _ = read(other, m, op="matmul accumulate")
        write(t, vals, m, op="matmul accumulate", accumulate=True, exempt=True)
        other.fresh = False
        src = other
    else:
        res = getattr(elementwise, fname)(t, other)
        vals, _ = read(res, res.pmask, op=fname)
        write(t, vals, op=fname, exempt=fname in _REDUCTIONS)
        res.fresh = False
        src = res
    if state.traces:
        trace.note_write(t.alloc.id, src.alloc.id, t.buffer)
    out = type(t)(t.alloc, t.arr, idx=t.idx, shape=t.shape, indirect=t.indirect, pax=t.pax, lay=t._lay)
    out.fresh = "acc"
    return out
