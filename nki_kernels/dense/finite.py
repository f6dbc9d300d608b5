"""Garbage isolation of the dense kernel: no non-finite value enters an instruction that mixes
the rows of several sequences.

Device code on the op layer (:mod:`nki_kernels.ops`; every function takes it first).

A 128-row Q tile of the dense kernel holds the query rows of many sequences, and two of its
instructions mix rows: the P V matmul (``0 * NaN`` is NaN, so a masked key's non-finite value
would reach every row of the tile) and, on NeuronCore-v2, the PE transposes (an identity matmul:
a non-finite element spreads along its whole transposed row -- of K rows before Q K^T, of P
before P V). So:

* every value row is checked before P V (:func:`finite_values`, both generations): a row that is
  not finite becomes zeros, and its key's fault flag (1.0) rides along as one more column of
  the moving operand, so a query row's fault sum is positive exactly when it gave that key a
  probability -- its output becomes NaN (the reference's would be non-finite too), while no
  other row ever multiplies the value;
* on NeuronCore-v2 (``ops.nc_gen() == "gen2"``) the K rows are checked before their PE
  transposes (:func:`finite_key_rows`), the new tokens' K^T and the scaled Q^T element by
  element (:func:`finite_columns`): a non-finite key is zeroed and its fault moved into its
  value row (one value becomes NaN, which :func:`finite_values` then flags), a non-finite query
  row is zeroed and flagged. NeuronCore-v3's transposes (DMA, or PE on the legacy API) move
  each element alone, so there a non-finite K or Q only reaches its own rows' scores, whose
  masks are selects.

What stays: the owner's rows are NaN whenever they see a faulty key (unless the key's weight
underflows to 0 in the running rescale); finite values so large (about 1e36 in a 128-wide row)
that a row's float32 sum overflows count as faults; on NeuronCore-v2, finite Q and K whose dot
product overflows float32 give an infinite score whose exponential is NaN, which the P
transposes spread (values of that size are garbage in any model).
"""

from __future__ import annotations

from nki_kernels.constants import B_P_SIZE

P = B_P_SIZE
# Columns per 128-key chunk of the values finite_values returns: the head size plus one
# fault-flag column (also the width of a slot's output state, ``flash_core``).
FAULT_COLUMNS = 1
# The NaN a faulty query row's divisor (its output) and a faulty key's value get.
FAULT_NAN = float("nan")


def value_stride(head_size):
    """Columns per 128-key chunk of :func:`finite_values`' layout: ``head_size + FAULT_COLUMNS``."""
    return head_size + FAULT_COLUMNS


def _finite_flags(ops, tile, n, width):
    """``(sums * 0, fin)``: per chunk i (columns ``[i*width, (i+1)*width)``) of each partition,
    its float32 sum times 0 -- 0, or NaN if the chunk holds a NaN / Inf -- as a (P, n) float32
    tile, and ``fin`` (P, n) ``ops.PRED``: 1 where that is 0. One VectorE reduce."""
    sums = ops.sbuf((P, n), ops.float32)
    ops.tensor_reduce(sums, "add", ops.free_view(tile, ((width, n), (1, width))), axis=(2,))
    zero = ops.sbuf((P, n), ops.float32)     # two instructions, not one fused: the multiply
    ops.tensor_scalar(zero, sums, "multiply", 0.0)    # alone goes to ScalarE, off VectorE (MODELED:
    fin = ops.sbuf((P, n), ops.PRED)                 # fused, 8 decodes on trn1 1384.7 -> 1398.7 us)
    ops.tensor_scalar(fin, zero, "equal", 0.0)
    return zero, fin


def finite_values(ops, v_tile, *, head_size, kernel_dtype):
    """``v_tile`` with every value row that is not finite set to 0, plus a fault column per
    128-key chunk (module docstring). Per KV tile, not per Q tile: one check serves every Q
    tile and query head of the group.

    Args:
        ops: the op layer.
        v_tile: SBUF ``(128, n_k * d)`` kernel_dtype (the ``load_kv_tile`` layout: chunk k of
            keys ``k*128 + p`` at partition p, columns ``[k*d, (k+1)*d)``).
        head_size: d.  kernel_dtype: dtype of v_tile and the result.

    Returns:
        SBUF ``(128, n_k * w)`` kernel_dtype, w = d + 1 (:func:`value_stride`): chunk k's values
        (0 where not finite) in columns ``[k*w, k*w + d)``, its keys' fault flags (1.0 / 0.0)
        in column ``k*w + d``.
    """
    d = head_size
    w = value_stride(d)
    n_k = v_tile.shape[1] // d
    _, fin = _finite_flags(ops, v_tile, n_k, d)
    v_out = ops.sbuf((P, n_k * w), kernel_dtype)
    ops.where_chunks(v_out, w, fin, v_tile, n_k, d)             # a select: NaN never multiplied
    ops.tensor_scalar_columns(v_out, d, w, fin, "multiply", -1.0, op1="add",
                              operand1=1.0)                     # fault = 1 - fin
    return v_out


def finite_key_rows(ops, k_rows, v_tile, v_col0, *, head_size):
    """NeuronCore-v2, before the PE transposes of one gathered load: zero the K rows that are
    not finite and make the same key's value row non-finite (its first value + NaN), so
    :func:`finite_values` flags the key.

    Args:
        k_rows: SBUF ``(128, b' * d)`` kernel dtype, token s of partition p in columns
            ``[s*d, (s+1)*d)``; updated in place.
        v_tile, v_col0: the SBUF tile holding the same keys' values in the same layout from
            column ``v_col0`` on; updated in place (a finite row is unchanged: ``x + 0``).
        head_size: d.
    """
    d = head_size
    n = k_rows.shape[1] // d
    zero, fin = _finite_flags(ops, k_rows, n, d)
    ops.where_chunks(k_rows, d, fin, k_rows, n, d)
    ops.tensor_tensor_columns(v_tile, v_col0, d, zero, "add")


def poison_values(ops, v_tile, counts, *, head_size):
    """NeuronCore-v2: make value row k*128 + p of ``v_tile`` (the ``load_kv_tile`` layout)
    non-finite (its first value + NaN) where ``counts[p, k]`` (PSUM / SBUF ``(128, n)``, from
    :func:`finite_columns` of the same keys' K^T) is not 0, so :func:`finite_values` flags it."""
    n = counts.shape[1]
    ok = ops.sbuf((P, n), ops.PRED)
    ops.tensor_scalar(ok, counts, "equal", 0.0)
    zeros = ops.zeros((P, n), ops.float32)
    poison = ops.sbuf((P, n), ops.float32)
    ops.where(poison, ok, zeros, FAULT_NAN)
    ops.tensor_tensor_columns(v_tile, 0, head_size, poison, "add")


def finite_columns(ops, x_t, ones, *, kernel_dtype):
    """NeuronCore-v2: zero the non-finite elements of a transposed tile (channels on
    partitions: Q^T or the new tokens' K^T) in place, and count them per column.

    Args:
        x_t: SBUF ``(d, n * 128)``; updated in place.
        ones: SBUF ``(d, 1)`` kernel_dtype of ones.
    Returns:
        PSUM ``(128, n)`` float32: column c, partition p = the non-finite channels of column
        ``c*128 + p`` (TensorE: the flags' transposed sum, one matmul per 128 columns).
    """
    d, width = x_t.shape
    n = width // P
    fin = ops.sbuf((d, width), ops.PRED)
    ops.tensor_scalar(fin, x_t, "multiply", 0.0, op1="equal", operand1=0.0)
    ops.where(x_t, fin, x_t, 0.0)
    bad = ops.sbuf((d, width), kernel_dtype)
    ops.tensor_scalar(bad, fin, "multiply", -1.0, op1="add", operand1=1.0)
    counts = ops.psum((P, n), ops.float32)
    for c in ops.parallel_range(n):
        ops.matmul(counts[:, ops.ds(c, 1)], bad[:, ops.ds(c * P, P)], ones)
    return counts
