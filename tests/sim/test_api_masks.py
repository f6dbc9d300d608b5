"""Mask predicates (affine, combined with ``&`` only), affine_select predicates, control
flow on index expressions, tensor_scalar operator classes, reads of masked-out results,
and a mutable input returned inside a tuple."""

from __future__ import annotations

import numpy as np
import pytest

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
import neuronxcc.nki.typing as nt

pytestmark = pytest.mark.simulation


@nki.jit
def mask_form_k(x, *, form):
    """Doubles x where the mask holds (other elements keep x); ``form`` picks the predicate."""
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    i_p = nl.arange(x.shape[0])[:, None]
    i_f = nl.arange(x.shape[1])[None, :]
    tile = nl.load(x)
    if form == "amp":
        mask = (i_p < 20) & (i_f >= 3)
    elif form == "and":
        mask = (i_p < 20) and (i_f >= 3)          # Python `and` is not supported in masks
    elif form == "affine":
        mask = (2 * i_p + 1 < i_f + 10)
    else:
        mask = (i_p % 4 == 0)                     # non-affine term
    tile[i_p, i_f] = nl.multiply(tile[i_p, i_f], 2.0, mask=mask)
    nl.store(out, value=tile)
    return out


@pytest.mark.parametrize("form", ["amp", "affine"])
def test_affine_masks_combined_with_ampersand(rng, form):
    x = rng.standard_normal((32, 16)).astype(np.float32)
    out = nki.simulate_kernel(mask_form_k, x, form=form)
    p, f = np.arange(32)[:, None], np.arange(16)[None, :]
    m = ((p < 20) & (f >= 3)) if form == "amp" else (2 * p + 1 < f + 10)
    np.testing.assert_array_equal(out, np.where(m, 2 * x, x))


def test_python_and_in_a_mask_fails(rng, rejects):
    x = rng.standard_normal((32, 16)).astype(np.float32)
    with rejects(Exception, match=r"(?i)truth value|and|mask"):
        nki.simulate_kernel(mask_form_k, x, form="and")


def test_non_affine_mask_fails(rng, rejects):
    x = rng.standard_normal((32, 16)).astype(np.float32)
    with rejects(Exception, match=r"(?i)mask|affine|expression"):
        nki.simulate_kernel(mask_form_k, x, form="mod")


@nki.jit
def affine_select_pred_k(x, *, compound):
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    i_p = nl.arange(x.shape[0])[:, None]
    i_f = nl.arange(x.shape[1])[None, :]
    pred = ((i_f <= i_p) & (i_f >= 2)) if compound else (i_f <= i_p)
    nl.store(out, value=nisa.affine_select(pred=pred, on_true_tile=nl.load(x), on_false_value=0.0))
    return out


def test_affine_select_single_comparison_passes_compound_fails(rng, rejects):
    # legacy affine_select: the predicate is a single affine comparison (no &)
    x = rng.standard_normal((16, 16)).astype(np.float32)
    out = nki.simulate_kernel(affine_select_pred_k, x, compound=False)
    np.testing.assert_array_equal(out, np.where(np.tril(np.ones((16, 16), bool)), x, 0))
    with rejects(Exception, match=r"(?i)pred|&|compound|single"):
        nki.simulate_kernel(affine_select_pred_k, x, compound=True)


@nki.jit
def branch_k(x, *, on_index):
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    i_p = nl.arange(x.shape[0])[:, None]
    tile = nl.load(x)
    cond = (i_p < 8) if on_index else (x.shape[0] < 8)
    if cond:                                     # control flow on an arange is not allowed
        tile = nl.multiply(tile, 2.0)
    nl.store(out, value=tile)
    return out


def test_control_flow_on_python_values_passes_on_arange_fails(rng, rejects):
    x = rng.standard_normal((16, 4)).astype(np.float32)
    np.testing.assert_array_equal(nki.simulate_kernel(branch_k, x, on_index=False), x)
    with rejects(Exception, match=r"(?i)control flow|arange|truth value"):
        nki.simulate_kernel(branch_k, x, on_index=True)


@nki.jit
def tensor_scalar_classes_k(x, *, mixed):
    out = nl.ndarray(x.shape, dtype=nl.int32, buffer=nl.shared_hbm)
    op1 = np.add if mixed else np.right_shift
    nl.store(out, value=nisa.tensor_scalar(nl.load(x), np.bitwise_and, 0xFF0, op1=op1, operand1=4))
    return out


def test_tensor_scalar_bitvec_pair_passes_mixed_classes_fail(rng, rejects):
    # the two tensor_scalar operators must be of the same class (both bitvec or both arithmetic)
    x = rng.integers(0, 2**20, size=(32, 8)).astype(np.int32)
    np.testing.assert_array_equal(nki.simulate_kernel(tensor_scalar_classes_k, x, mixed=False),
                                  (x & 0xFF0) >> 4)
    with rejects(Exception, match=r"(?i)bitvec|arithmetic|class|same"):
        nki.simulate_kernel(tensor_scalar_classes_k, x, mixed=True)


@nki.jit
def masked_result_k(x, *, store_rows):
    """y = exp(x) computed only for rows < 16 of a fresh result tile; store rows < store_rows."""
    out = nl.ndarray((store_rows, x.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    i_p = nl.arange(x.shape[0])[:, None]
    i_f = nl.arange(x.shape[1])[None, :]
    y = nl.exp(nl.load(x)[i_p, i_f], mask=(i_p < 16))
    nl.store(out, value=y[0:store_rows, :])
    return out


def test_masked_out_elements_of_a_fresh_result_are_never_written(rng, sim_only, rejects):
    import nki_sim.errors

    x = rng.standard_normal((32, 8)).astype(np.float32)
    out = nki.simulate_kernel(masked_result_k, x, store_rows=16)
    np.testing.assert_allclose(out, np.exp(x[:16].astype(np.float64)), rtol=1e-6)
    with rejects(nki_sim.errors.UninitializedReadError):
        nki.simulate_kernel(masked_result_k, x, store_rows=17)


@nki.jit
def load_unwritten_output_k(x, *, write_first):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    if write_first:
        nl.store(out, value=nl.load(x))
    nl.store(out, value=nl.multiply(nl.load(out), 2.0))
    return out


def test_loading_a_never_written_output_is_detected(rng, sim_only, rejects):
    import nki_sim.errors

    x = rng.standard_normal((16, 4)).astype(np.float32)
    np.testing.assert_allclose(nki.simulate_kernel(load_unwritten_output_k, x, write_first=True),
                               2 * x.astype(np.float64), rtol=1e-6)
    with rejects(nki_sim.errors.UninitializedReadError):
        nki.simulate_kernel(load_unwritten_output_k, x, write_first=False)


@nki.jit
def mutable_in_tuple_k(acc: nt.mutable_tensor, x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    tile = nl.load(x)
    nl.store(acc, value=nl.add(nl.load(acc), tile))
    nl.store(out, value=nl.multiply(tile, -1.0))
    return out, acc


def test_mutable_input_returned_inside_a_tuple(rng):
    acc = rng.standard_normal((16, 4)).astype(np.float32)
    x = rng.standard_normal((16, 4)).astype(np.float32)
    ref = acc + x
    out, acc_out = nki.simulate_kernel(mutable_in_tuple_k, acc, x)
    np.testing.assert_array_equal(out, -x)
    np.testing.assert_array_equal(acc_out, ref)
    np.testing.assert_array_equal(acc, ref)


@nki.jit
def masked_matmul_k(a_t, b, *, rows, cols, m_rows, m_cols):
    """out[:m_rows, :m_cols] = (a_t.T @ b) over a stationary tile with only its first ``rows``
    columns written and a moving tile with only its first ``cols`` columns written; the matmul
    is masked to output rows < m_rows and columns < m_cols."""
    K, M = a_t.shape
    N = b.shape[1]
    out = nl.ndarray((m_rows, m_cols), dtype=nl.float32, buffer=nl.shared_hbm)
    i_k = nl.arange(K)[:, None]
    i_m = nl.arange(M)[None, :]
    i_n = nl.arange(N)[None, :]
    i_p = nl.arange(M)[:, None]
    st = nl.ndarray((K, M), dtype=nl.float32, buffer=nl.sbuf)
    mv = nl.ndarray((K, N), dtype=nl.float32, buffer=nl.sbuf)
    st[i_k, i_m] = nl.load(a_t[i_k, i_m], mask=(i_m < rows))
    mv[i_k, i_n] = nl.load(b[i_k, i_n], mask=(i_n < cols))
    ps = nisa.nc_matmul(st[i_k, i_m], mv[i_k, i_n], mask=(i_p < m_rows) & (i_n < m_cols))
    res = nl.copy(ps[0:m_rows, 0:m_cols], dtype=nl.float32)
    nl.store(out, value=res)
    return out


def test_masked_nc_matmul_reads_only_the_operand_columns_its_outputs_use(rng, sim_only, rejects):
    """A masked-off output row / column reads no stationary / moving column (NKI masking: the
    predicate controls whether the instruction executes for an element): the never-written
    operand columns beyond the mask are not read; one column more is an uninitialized read."""
    import nki_sim.errors

    a_t = rng.standard_normal((64, 128)).astype(np.float32)
    b = rng.standard_normal((64, 512)).astype(np.float32)
    ref = a_t.astype(np.float64).T @ b.astype(np.float64)
    out = nki.simulate_kernel(masked_matmul_k, a_t, b, rows=100, cols=192, m_rows=100, m_cols=192)
    np.testing.assert_allclose(out, ref[:100, :192], rtol=1e-4, atol=1e-4)
    with rejects(nki_sim.errors.UninitializedReadError, match="nc_matmul"):
        nki.simulate_kernel(masked_matmul_k, a_t, b, rows=100, cols=192, m_rows=100, m_cols=193)
    with rejects(nki_sim.errors.UninitializedReadError, match="nc_matmul"):
        nki.simulate_kernel(masked_matmul_k, a_t, b, rows=100, cols=192, m_rows=101, m_cols=192)


@nki.jit
def masked_matmul_acc_k(a_t, b, *, cols, m_cols, store_cols):
    """psum[:, :m_cols] += a_t.T @ b over two K halves, the matmuls masked to columns < m_cols
    (the moving tile has only its first ``cols`` columns written); store ``store_cols`` columns."""
    K, M = a_t.shape
    N = b.shape[1]
    out = nl.ndarray((M, store_cols), dtype=nl.float32, buffer=nl.shared_hbm)
    i_k = nl.arange(K // 2)[:, None]
    i_m = nl.arange(M)[None, :]
    i_n = nl.arange(N)[None, :]
    acc = nl.zeros((M, N), dtype=nl.float32, buffer=nl.psum)
    for h in nl.affine_range(2):
        st = nl.load(a_t[h * (K // 2) + i_k, i_m])
        mv = nl.ndarray((K // 2, N), dtype=nl.float32, buffer=nl.sbuf)
        mv[i_k, i_n] = nl.load(b[h * (K // 2) + i_k, i_n], mask=(i_n < cols))
        acc[...] += nisa.nc_matmul(st, mv[i_k, i_n], mask=(i_n < m_cols))
    res = nl.copy(acc[:, 0:store_cols], dtype=nl.float32)
    nl.store(out, value=res)
    return out


def test_masked_nc_matmul_accumulates_only_its_unmasked_elements(rng, sim_only, rejects):
    """psum += masked nc_matmul updates the unmasked elements only: the accumulator keeps its
    zeros elsewhere; an unmasked column whose moving column was never written still fails."""
    import nki_sim.errors

    a_t = rng.standard_normal((128, 64)).astype(np.float32)
    b = rng.standard_normal((128, 512)).astype(np.float32)
    ref = a_t.astype(np.float64).T @ b.astype(np.float64)
    out = nki.simulate_kernel(masked_matmul_acc_k, a_t, b, cols=192, m_cols=192, store_cols=256)
    np.testing.assert_allclose(out[:, :192], ref[:, :192], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(out[:, 192:], 0.0)
    with rejects(nki_sim.errors.UninitializedReadError, match="nc_matmul"):
        nki.simulate_kernel(masked_matmul_acc_k, a_t, b, cols=192, m_cols=193, store_cols=256)
