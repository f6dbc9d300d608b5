"""Input checks for the host layer. Every failure is a ``ValueError`` worded

    "<arg> must <constraint>; got <value>"

so the message names the argument, the constraint and the value received. The checks return
the normalised NumPy value so callers validate and convert in one step.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from host._arrays import to_numpy

__all__ = [
    "fail",
    "check_int",
    "check_power_of_two",
    "check_lens",
    "check_ndim",
    "check_shape",
    "check_integer_array",
    "check_float_array",
    "check_index_range",
    "check_block_tables",
    "check_slot_mapping",
    "check_softmax_scale",
    "is_float_dtype",
    "summarize",
]


def summarize(value: Any, limit: int = 8) -> str:
    """Short printable form of ``value`` for error messages (arrays are truncated)."""
    if isinstance(value, np.ndarray):
        return f"array(shape={value.shape}, dtype={value.dtype}, values=[{_first_values(value, limit)}])"
    return repr(value)


def _first_values(arr: np.ndarray, limit: int = 8) -> str:
    flat = arr.ravel()
    return ", ".join(str(v) for v in flat[:limit].tolist()) + (", ..." if flat.size > limit else "")


def _first_offender(arg: str, arr: np.ndarray, bad: np.ndarray) -> str:
    """``arg[i, j] = value`` for the first True entry of ``bad`` (same shape as ``arr``)."""
    pos = np.unravel_index(int(np.argmax(bad)), arr.shape)
    return f"{arg}[{', '.join(map(str, pos))}] = {arr[pos]}"


def fail(arg: str, constraint: str, got: Any) -> None:
    """Raise the standard ValueError."""
    raise ValueError(f"{arg} must {constraint}; got {summarize(got) if not isinstance(got, str) else got}")


def check_int(arg: str, value: Any, *, min_value: int | None = None,
              max_value: int | None = None) -> int:
    """A Python/NumPy integer (not bool) within ``[min_value, max_value]``; returns ``int``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        fail(arg, "be an integer", repr(value))
    v = int(value)
    if min_value is not None and v < min_value:
        fail(arg, f"be >= {min_value}", repr(v))
    if max_value is not None and v > max_value:
        fail(arg, f"be <= {max_value}", repr(v))
    return v


def check_power_of_two(arg: str, value: Any, *, lo: int, hi: int) -> int:
    """An integer power of two in ``[lo, hi]``; returns ``int``."""
    v = check_int(arg, value)
    if v < lo or v > hi or v & (v - 1) != 0:
        fail(arg, f"be a power of two in [{lo}, {hi}]", repr(v))
    return v


def is_float_dtype(dtype: np.dtype) -> bool:
    """True for NumPy floats and the ml_dtypes floats (bfloat16, float8 ...)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return True
    try:
        import ml_dtypes

        ml_dtypes.finfo(dtype)
        return dtype.kind == "V"
    except (ImportError, ValueError, TypeError):
        return False


def check_ndim(arg: str, arr: np.ndarray, ndim: int) -> None:
    if arr.ndim != ndim:
        fail(arg, f"be {ndim}-D", f"shape {arr.shape}")


def check_shape(arg: str, arr: np.ndarray, expected: Sequence[int | None], what: str = "") -> None:
    """``arr.shape`` must match ``expected`` (``None`` = any size). ``what`` names the dims."""
    ok = arr.ndim == len(expected) and all(e is None or s == e for s, e in zip(arr.shape, expected))
    if not ok:
        want = "(" + ", ".join("*" if e is None else str(e) for e in expected) + ")"
        fail(arg, f"have shape {want}{' ' + what if what else ''}", f"shape {arr.shape}")


_INT64_MAX = np.iinfo(np.int64).max


def check_integer_array(arg: str, x: Any, *, ndim: int | None = None) -> np.ndarray:
    """Array of an integer dtype with values in the int64 range; returns it as int64.

    Rejected with a ValueError naming ``arg``: bool, float (also whole-valued, e.g. a Python
    list ``[1.0, 2.0]``: integers are never guessed from floats), object and string data, and
    unsigned values >= 2**63 (shown with their true value, not wrapped to a negative int64).
    """
    arr, _ = to_numpy(x, arg)
    if arr.dtype == object and arr.size and all(
            isinstance(v, int) and not isinstance(v, bool) for v in arr.flat):
        # Python ints outside the int64 range (NumPy keeps them as objects)
        bad = np.array([abs(v) > _INT64_MAX for v in arr.flat]).reshape(arr.shape)
        fail(arg, "hold values in the int64 range", _first_offender(arg, arr, bad))
    if arr.dtype.kind not in "iu" and not (arr.size == 0 and arr.dtype.kind == "f"):
        # (an empty Python list becomes float64; let the size checks report it instead)
        hint = " (floats are not converted to integers, even whole ones)" if arr.dtype.kind == "f" else ""
        fail(arg, "have an integer dtype", f"dtype {arr.dtype} with values [{_first_values(arr)}]{hint}")
    if ndim is not None:
        check_ndim(arg, arr, ndim)
    if arr.dtype.kind == "u" and arr.dtype.itemsize >= 8 and arr.size and arr.max() > _INT64_MAX:
        fail(arg, "hold values below 2**63 (the int64 range)",
             f"{_first_offender(arg, arr, arr > _INT64_MAX)} (dtype {arr.dtype})")
    return arr.astype(np.int64, copy=False)


def check_float_array(arg: str, x: Any, *, ndim: int | None = None) -> np.ndarray:
    """Array of a floating dtype (float16/32/64, bfloat16 ...); returned unchanged."""
    arr, _ = to_numpy(x, arg)
    if not is_float_dtype(arr.dtype):
        fail(arg, "have a floating dtype", f"dtype {arr.dtype}")
    if ndim is not None:
        check_ndim(arg, arr, ndim)
    return arr


def check_lens(arg: str, x: Any, *, min_value: int, length: int | None = None,
               length_arg: str = "") -> np.ndarray:
    """A 1-D integer length vector with every entry >= ``min_value``; returns int64.

    ``length`` (if given) is the required number of entries; ``length_arg`` names where that
    number comes from, for the message.
    """
    arr = check_integer_array(arg, x, ndim=1)
    if length is not None and arr.shape[0] != length:
        fail(arg, f"have {length} entries (one per sequence{', as ' + length_arg if length_arg else ''})",
             f"{arr.shape[0]} entries")
    if arr.size and arr.min() < min_value:
        bad = int(np.argmax(arr < min_value))
        fail(arg, f"be >= {min_value} everywhere", f"{arg}[{bad}] = {int(arr[bad])}")
    return arr


def check_query_total(query_lens: Any, num_tokens: int) -> np.ndarray:
    """``query_lens`` (each >= 1, :func:`check_lens`) summing exactly to ``num_tokens`` (the
    rows of query), checked before any planning work (the sum in Python integers: no
    overflow); returns the int64 vector."""
    q = check_lens("query_lens", query_lens, min_value=1)
    total = sum(q.astype(object).tolist())
    if total != num_tokens:
        fail("query_lens", f"sum to query.shape[0] = {num_tokens}", f"sum {total}")
    return q


def check_index_range(arg: str, ids: np.ndarray, *, upper: int, what: str) -> None:
    """Every entry of ``ids`` in ``[0, upper)``; the message shows the first offender."""
    if ids.size == 0:
        return
    bad = (ids < 0) | (ids >= upper)
    if bad.any():
        fail(arg, f"hold {what} in [0, {upper})", _first_offender(arg, ids, bad))


def check_slot_mapping(slot_mapping: Any, *, num_tokens: int, num_slots: int,
                       tokens_arg: str) -> np.ndarray:
    """A cache write's ``slot_mapping``: (num_tokens,) integers, negative = padding (skipped), every
    other slot < ``num_slots`` and not repeated. Returns int64. ``tokens_arg`` names the array
    whose rows are the tokens, for the message."""
    slots = check_integer_array("slot_mapping", slot_mapping, ndim=1)
    if slots.shape[0] != num_tokens:
        fail("slot_mapping", f"have {num_tokens} entries (one per token of {tokens_arg})",
             f"{slots.shape[0]} entries")
    raw, _ = to_numpy(slot_mapping, "slot_mapping")  # range-check the raw values: a uint64 >= 2**63
    bad = np.flatnonzero(raw >= num_slots)             # would wrap to a negative (= skip) int64
    if bad.size:
        fail("slot_mapping", f"hold slots < num_blocks * block_size = {num_slots} (negative = skip)",
             f"slot_mapping[{bad[0]}] = {raw[bad[0]]}")
    uniq, counts = np.unique(slots[slots >= 0], return_counts=True)
    if (counts > 1).any():
        fail("slot_mapping", "not repeat a non-negative slot (a DMA scatter to one slot twice has no "
             "defined order)", f"repeated slots {uniq[counts > 1][:8].tolist()}")
    return slots


def check_softmax_scale(softmax_scale: Any, default: float) -> float:
    """``softmax_scale`` as a float: ``default`` when None, else a finite real number (not bool)."""
    if softmax_scale is None:
        return float(default)
    if isinstance(softmax_scale, (bool, np.bool_)) or \
            not isinstance(softmax_scale, (int, float, np.integer, np.floating)) or \
            not math.isfinite(float(softmax_scale)):
        fail("softmax_scale", "be a finite real number or None", repr(softmax_scale))
    return float(softmax_scale)


def check_block_tables(bt: np.ndarray, context_lens: np.ndarray, *, block_size: int,
                       num_blocks: int) -> np.ndarray:
    """``block_tables`` (integer, already 2-D) for S = len(context_lens) sequences: S rows; row i's
    first ceil(context_lens[i] / block_size) entries are block ids in [0, num_blocks), later entries
    are ignored (e.g. -1). Returns those per-sequence block counts (S,) int64."""
    S = context_lens.shape[0]
    if bt.shape[0] != S:
        fail("block_tables", f"have {S} rows (one per sequence)", f"shape {bt.shape}")
    nblk = -(-context_lens.astype(np.int64) // block_size)
    if S and int(nblk.max()) > bt.shape[1]:
        i = int(np.argmax(nblk))
        fail("block_tables", f"have >= ceil(context_lens[{i}] / block_size {block_size}) = {int(nblk[i])} "
             "columns", f"shape {bt.shape}")
    used = np.arange(bt.shape[1])[None, :] < nblk[:, None]
    check_index_range("block_tables", np.where(used, bt, 0), upper=num_blocks,
                      what="block ids (inside kv_cache)")
    return nblk
