"""ScalarE: ``activation`` (``dst = fn(data * scale + bias)`` in fp32) with the per-partition
accumulator (``reduce_cmd`` idle / reset / reduce / reset_reduce, read out into ``reduce_res``).
Its trace events carry the function's name (``Event.attr("func")``, e.g. ``"exp"``)."""

from __future__ import annotations

import numpy as np

from ..alu import apply_act, reduce_values
from .common import accumulators, emit, operand, pvec, write_dst


def activation(dst, fn: str, data, *, bias=None, scale=1.0, reduce_alu=None, reduce_res=None,
               reduce_cmd: str = "idle", op: str = "activation", name: str = "") -> None:
    """``dst[P, F] = fn(data * scale + bias)``; ``bias`` / ``scale`` scalars or [P, 1] tiles."""
    a = operand(data, "data", op, True)
    P = a.shape[0] if a.shape else 1
    so = operand(scale, "scale", op)
    bo = operand(bias, "bias", op, True) if bias is not None else None
    z = np.asarray(a.v, np.float32).reshape(P, -1) * pvec(so, P, "scale", op)
    if bo is not None:
        z = z + pvec(bo, P, "bias", op)
    out = apply_act(fn, z)
    write_dst(dst, out, op, inputs=(a, bo))
    reduces = op == "activation_reduce" or reduce_res is not None or reduce_cmd != "idle"
    attrs = {"func": fn, "reduce": True} if reduces else {"func": fn}
    emit("scalar", op, tuple(o for o in (a, bo, so) if o is not None), dst, name=name,
         attrs=attrs)
    if not reduces:
        return
    if reduce_res is not None and reduce_cmd == "idle":
        reduce_cmd = "reset_reduce"
    acc = accumulators()["scalar"]
    part = reduce_values(reduce_alu or "add", out.reshape(P, -1), 1)
    if reduce_cmd == "reset":
        acc[:P] = 0
    elif reduce_cmd == "reset_reduce":
        acc[:P] = part
    elif reduce_cmd == "reduce":
        acc[:P] = reduce_values(reduce_alu or "add", np.stack([acc[:P], part]), 0)
    if reduce_res is not None:
        write_dst(reduce_res, acc[:P].reshape(reduce_res.shape), op)
