"""The affine_range loop-carried-dependency checker on harder patterns: write-after-read,
dependencies through HBM, and nests of affine and sequential loops (the check is per
affine loop: only iterations of the *same* affine loop instance may not share elements)."""

from __future__ import annotations

import numpy as np
import pytest

import neuronxcc.nki as nki
import neuronxcc.nki.language as nl
import neuronxcc.nki.typing as nt

pytestmark = pytest.mark.simulation

DEP = "Unexpected output dependencies"


@nki.jit
def war_columns_k(x, *, loop):
    """buf[:, i] = 3 * buf[:, i + 1]: iteration i reads a column iteration i + 1 overwrites."""
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    buf = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    buf[...] = nl.load(x)
    for i in getattr(nl, loop)(x.shape[1] - 1):
        buf[:, nl.ds(i, 1)] = nl.multiply(buf[:, nl.ds(i + 1, 1)], 3.0)
    nl.store(out, value=buf)
    return out


def test_write_after_read_across_iterations(rng, sim_only, rejects):
    # element-level (simulator) check: the dst access contains the loop index, so the legacy
    # compiler's syntactic check need not fire; the sequential twin is portable
    x = rng.standard_normal((32, 5)).astype(np.float32)
    out = nki.simulate_kernel(war_columns_k, x, loop="sequential_range")
    ref = x.astype(np.float64).copy()
    ref[:, :-1] = 3 * x[:, 1:]              # in order: each read sees the original column
    np.testing.assert_allclose(out, ref, rtol=1e-6)
    with rejects(SyntaxError, match=DEP):
        nki.simulate_kernel(war_columns_k, x, loop="affine_range")


@nki.jit
def hbm_chain_k(x, work: nt.mutable_tensor, *, loop):
    """work row-block i+1 = 2 * work row-block i, through HBM (store, then load next iteration)."""
    nl.store(work[0:128, :], value=nl.load(x))
    for i in getattr(nl, loop)(work.shape[0] // 128 - 1):
        prev = nl.load(work[nl.ds(i * 128, 128), :])
        nl.store(work[nl.ds((i + 1) * 128, 128), :], value=nl.multiply(prev, 2.0))
    return work


def test_dependency_through_hbm(rng, sim_only, rejects):
    x = rng.standard_normal((128, 4)).astype(np.float32)
    work = np.zeros((384, 4), np.float32)
    out = nki.simulate_kernel(hbm_chain_k, x, work, loop="sequential_range")
    np.testing.assert_allclose(out, np.concatenate([x, 2 * x, 4 * x]), rtol=1e-6)
    with rejects(SyntaxError, match=DEP):
        nki.simulate_kernel(hbm_chain_k, x, np.zeros((384, 4), np.float32), loop="affine_range")


@nki.jit
def nest_k(x, *, outer, inner):
    """acc[:, j] += x[:, j] for i in <outer>(3), j in <inner>(2): acc carries across i only."""
    out = nl.ndarray((x.shape[0], 2), dtype=nl.float32, buffer=nl.shared_hbm)
    tile = nl.load(x)
    acc = nl.zeros((x.shape[0], 2), dtype=nl.float32)
    for i in getattr(nl, outer)(3):
        for j in getattr(nl, inner)(2):
            acc[:, nl.ds(j, 1)] = nl.add(acc[:, nl.ds(j, 1)], tile[:, nl.ds(j, 1)])
    nl.store(out, value=acc)
    return out


def test_affine_inner_loop_inside_sequential_outer_loop_passes(rng):
    x = rng.standard_normal((16, 2)).astype(np.float32)
    out = nki.simulate_kernel(nest_k, x, outer="sequential_range", inner="affine_range")
    np.testing.assert_allclose(out, 3 * x.astype(np.float64), rtol=1e-6)


def test_dependency_carried_by_the_affine_outer_loop_fails(rng, rejects):
    x = rng.standard_normal((16, 2)).astype(np.float32)
    with rejects(SyntaxError, match=DEP):
        nki.simulate_kernel(nest_k, x, outer="affine_range", inner="sequential_range")


@nki.jit
def shared_read_k(x, *, n):
    """A tile loaded once and only read by every affine iteration (no dependency)."""
    out = nl.ndarray((x.shape[0], n * x.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    tile = nl.load(x)
    for i in nl.affine_range(n):
        nl.store(out[:, nl.ds(i * x.shape[1], x.shape[1])], value=nl.multiply(tile, i + 1.0))
    return out


def test_read_only_sharing_across_affine_iterations_passes(rng):
    x = rng.standard_normal((64, 8)).astype(np.float32)
    out = nki.simulate_kernel(shared_read_k, x, n=3)
    np.testing.assert_allclose(out, np.concatenate([x, 2 * x, 3 * x], axis=1), rtol=1e-6)


@nki.jit
def temp_reuse_k(x, *, hoisted):
    """Copy 128-row blocks through one temporary: allocated inside the loop (fresh per
    iteration) or hoisted above it (the same elements written by every iteration)."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    tmp = nl.ndarray((128, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
    for i in nl.affine_range(x.shape[0] // 128):
        if not hoisted:
            tmp = nl.ndarray((128, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
        tmp[...] = nl.load(x[nl.ds(i * 128, 128), :])
        nl.store(out[nl.ds(i * 128, 128), :], value=tmp)
    return out


def test_temporary_allocated_per_iteration_passes_hoisted_fails(rng, rejects):
    x = rng.standard_normal((256, 8)).astype(np.float32)
    np.testing.assert_array_equal(nki.simulate_kernel(temp_reuse_k, x, hoisted=False), x)
    with rejects(SyntaxError, match=DEP):
        nki.simulate_kernel(temp_reuse_k, x, hoisted=True)


@nki.jit
def plus_equals_k(lhs_t, rhs, *, acc_buffer, matmul, op="+="):
    """acc <op> (lhs_t block k).T @ rhs block k (matmul) or rhs block k (plain) over an
    affine_range. In-place operators are reductions, which the affine_range documentation does
    not count as loop-carried dependencies; the explicit ``acc[...] = acc + x`` is one."""
    m_dim, n_dim = lhs_t.shape[1], rhs.shape[1]
    out = nl.ndarray((m_dim, n_dim), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.zeros((m_dim, n_dim), dtype=nl.float32, buffer=getattr(nl, acc_buffer))
    for k in nl.affine_range(lhs_t.shape[0] // 32):
        a = nl.load(lhs_t[nl.ds(k * 32, 32), :])
        b = nl.load(rhs[nl.ds(k * 32, 32), :])
        if matmul:
            acc += nl.matmul(a, b, transpose_x=True)
        elif op == "+=":
            acc += b
        elif op == "-=":
            acc -= b
        else:
            acc[...] = nl.add(acc, b)
    nl.store(out, value=nl.copy(acc))
    return out


def test_plus_equals_is_an_associative_reduction(rng, sim_only, rejects):
    lhs_t = rng.standard_normal((96, 32)).astype(np.float32)
    rhs = rng.standard_normal((96, 32)).astype(np.float32)
    out = nki.simulate_kernel(plus_equals_k, lhs_t, rhs, acc_buffer="psum", matmul=True)
    np.testing.assert_allclose(out, lhs_t.astype(np.float64).T @ rhs, rtol=1e-5, atol=1e-5)
    # SBUF accumulation of a VectorE result (AWS's fused Mamba tutorial: scanC_accum += scanC)
    ref = rhs.reshape(3, 32, 32).astype(np.float64).sum(axis=0)
    out = nki.simulate_kernel(plus_equals_k, lhs_t, rhs, acc_buffer="sbuf", matmul=False)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    out = nki.simulate_kernel(plus_equals_k, lhs_t, rhs, acc_buffer="sbuf", matmul=False, op="-=")
    np.testing.assert_allclose(out, -ref, rtol=1e-5, atol=1e-5)
    # must-fail twin: the same accumulation written as an explicit read-modify-write
    with rejects(SyntaxError, match=DEP):
        nki.simulate_kernel(plus_equals_k, lhs_t, rhs, acc_buffer="sbuf", matmul=False, op="assign")
