"""``nl.loop_reduce`` (legacy API): ``acc[...] = nl.loop_reduce(x, op, loop_indices)`` inside a
loop updates ``acc = op(acc, x)`` -- the documented equivalent is
``acc = nisa.tensor_tensor(data1=acc, data2=x, op)``, the destination being an input too -- as an
associative reduction over the loop (no loop-carried dependency error in ``affine_range``).
nki-samples' matmul tutorial and flash_attn_bwd use it to reduce PSUM matmul blocks into SBUF.
An accumulator region never written before starts the reduction (the first iteration stores x),
as NKIBench's compiler-generated kernels rely on; ``+=`` and partly written accumulators keep the
uninitialised-read error (nki_sim/README.md, rule 7)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

import nki_sim

pytestmark = pytest.mark.simulation
BF16 = ml_dtypes.bfloat16


@nki.jit
def loop_reduce_k(x, *, op, init, acc_dtype=np.float32, masked_rows=None):
    """acc (128, F) = op over k of x[k] (x: (K, 128, F)); acc starts at ``init``."""
    K, P, F = x.shape
    acc = nl.full((P, F), init, dtype=acc_dtype, buffer=nl.sbuf)
    i_p = nl.arange(P)[:, None]
    for k in nl.affine_range(K):
        t = nl.load(x[k])
        if masked_rows is None:
            acc[...] = nl.loop_reduce(t, op=op, loop_indices=[k], dtype=acc_dtype)
        else:
            acc[...] = nl.loop_reduce(t, op=op, loop_indices=(k,), dtype=acc_dtype,
                                      mask=(i_p < masked_rows))
    out = nl.ndarray((P, F), dtype=np.float32, buffer=nl.shared_hbm)
    nl.store(out, nl.copy(acc, dtype=np.float32))
    return out


@nki.jit
def blocked_matmul_k(lhs_t, rhs):
    """out (M, N) = lhs_t.T @ rhs with K in blocks of 128: each block's PSUM product is reduced
    into an SBUF accumulator with nl.loop_reduce (the tutorials' block-K pattern)."""
    K, M = lhs_t.shape
    N = rhs.shape[1]
    acc = nl.zeros((M, N), dtype=np.float32, buffer=nl.sbuf)
    for kb in nl.affine_range(K // 128):
        a = nl.load(lhs_t[nl.ds(kb * 128, 128), :])
        b = nl.load(rhs[nl.ds(kb * 128, 128), :])
        ps = nl.ndarray((M, N), dtype=np.float32, buffer=nl.psum)
        ps[...] = nisa.nc_matmul(a, b)
        acc[...] = nl.loop_reduce(ps, op=np.add, loop_indices=[kb], dtype=np.float32)
    out = nl.ndarray((M, N), dtype=np.float32, buffer=nl.shared_hbm)
    nl.store(out, acc)
    return out


@pytest.mark.parametrize("op,init,ref", [(np.add, 0.0, np.sum), (np.max, -1e30, np.max),
                                         (nl.minimum, 1e30, np.min), (np.multiply, 1.0, np.prod)])
def test_loop_reduce_equals_numpy(rng, op, init, ref):
    x = rng.uniform(0.5, 1.5, size=(5, 128, 64)).astype(np.float32)
    out = nki.simulate_kernel(loop_reduce_k, x, op=op, init=init)
    np.testing.assert_allclose(out, ref(x.astype(np.float64), axis=0), rtol=2e-6)


def test_loop_reduce_into_bf16_rounds_every_step(rng):
    x = rng.uniform(-1, 1, size=(4, 128, 32)).astype(np.float32)
    out = nki.simulate_kernel(loop_reduce_k, x, op=np.add, init=0.0, acc_dtype=BF16)
    acc = np.zeros((128, 32), np.float64)
    for k in range(4):                     # fp32 math, bf16 storage after each step
        acc = (acc.astype(np.float32) + x[k]).astype(BF16).astype(np.float64)
    np.testing.assert_array_equal(out, acc.astype(np.float32))


def test_masked_loop_reduce_leaves_other_rows(rng):
    x = rng.uniform(0, 1, size=(3, 128, 16)).astype(np.float32)
    out = nki.simulate_kernel(loop_reduce_k, x, op=np.add, init=7.0, masked_rows=100)
    ref = np.full((128, 16), 7.0)
    ref[:100] += x[:, :100].astype(np.float64).sum(axis=0)
    np.testing.assert_allclose(out, ref, rtol=2e-6)


def test_loop_reduce_of_psum_blocks_is_a_blocked_matmul(rng):
    lhs_t = rng.standard_normal((384, 64)).astype(np.float32)
    rhs = rng.standard_normal((384, 96)).astype(np.float32)
    out = nki.simulate_kernel(blocked_matmul_k, lhs_t, rhs)
    np.testing.assert_allclose(out, lhs_t.astype(np.float64).T @ rhs.astype(np.float64),
                               rtol=1e-4, atol=1e-4)


def test_loop_reduce_records_the_tensor_tensor_it_is(rng, sim_only):
    x = rng.uniform(0, 1, size=(2, 128, 8)).astype(np.float32)
    with nki_sim.tracing() as trace:
        nki.simulate_kernel(loop_reduce_k, x, op=np.add, init=0.0)
    ev = [e for e in trace.events if e.op == "tensor_tensor"]
    assert len(ev) == 2 and all(e.engine == "vector" and e.attr("alu") == "add" for e in ev)


@nki.jit
def misuse_k(x, *, mode):
    acc = nl.zeros((128, 8), dtype=np.float32, buffer=nl.sbuf)
    for k in nl.affine_range(2):
        t = nl.load(x[k])
        if mode == "subtract":
            acc[...] = nl.loop_reduce(t, op=np.subtract, loop_indices=[k])
        elif mode == "bad_indices":
            acc[...] = nl.loop_reduce(t, op=np.add, loop_indices="k")
        elif mode == "unassigned":
            r = nl.loop_reduce(t, op=np.add, loop_indices=[k])
            acc[...] = nl.add(acc, r)
        else:
            acc[...] = nl.loop_reduce(t, op=np.add, loop_indices=[k])
    out = nl.ndarray((128, 8), dtype=np.float32, buffer=nl.shared_hbm)
    nl.store(out, acc)
    return out


@pytest.mark.parametrize("mode,exc,match", [
    ("subtract", NotImplementedError, r"loop_reduce\(op=subtract\).*nisa.tensor_tensor"),
    ("bad_indices", ValueError, r"loop_indices must be a loop index.*got 'k'"),
    ("unassigned", TypeError, r"result of nl.loop_reduce, which must be assigned"),
])
def test_loop_reduce_misuse_is_rejected(rng, sim_only, rejects, mode, exc, match):
    x = rng.uniform(0, 1, size=(2, 128, 8)).astype(np.float32)
    with rejects(exc, match=match):
        nki.simulate_kernel(misuse_k, x, mode=mode)


def test_loop_reduce_reads_its_initialised_accumulator(rng, sim_only):
    """An initialised accumulator is the rhs input (the API page's rule): zeros plus the sum."""
    x = rng.uniform(0, 1, size=(2, 128, 8)).astype(np.float32)
    np.testing.assert_allclose(nki.simulate_kernel(misuse_k, x, mode="ok"),
                               x.astype(np.float64).sum(axis=0), rtol=1e-6)


# ---------------------------------------------------------------- never-initialised accumulator
# NKIBench's rmsnorm_matmul / bmm_softmax / gqa_full reduce into an SBUF accumulator that no
# instruction writes first, and match NumPy on trn1: a never-written accumulator region starts
# the reduction (its first iteration stores x), nki_sim/README.md rule 7.

@nki.jit
def uninit_reduce_k(x, *, op, acc_dtype=np.float32):
    """out[:, a*F:(a+1)*F] = op over k of x[a, k]: acc is never initialised and each outer
    iteration ``a`` reduces its own region over the inner loop (NKIBench's block pattern)."""
    A, K, P, F = x.shape
    acc = nl.ndarray((P, A * F), dtype=acc_dtype, buffer=nl.sbuf)
    for a in nl.affine_range(A):
        for k in nl.affine_range(K):
            t = nl.load(x[a, k])
            acc[:, nl.ds(a * F, F)] = nl.loop_reduce(t, op=op, loop_indices=[k], dtype=acc_dtype)
    out = nl.ndarray((P, A * F), dtype=np.float32, buffer=nl.shared_hbm)
    nl.store(out, nl.copy(acc, dtype=np.float32))
    return out


def _blocks(r):
    """(A, P, F) -> (P, A*F), the kernel's output layout."""
    return np.concatenate(list(r), axis=1)


@pytest.mark.parametrize("op,ref", [(np.add, np.sum), (np.max, np.max), (nl.minimum, np.min),
                                    (np.multiply, np.prod)])
def test_never_initialised_accumulator_starts_the_reduction(rng, sim_only, op, ref):
    # all-negative data for max (and all-positive for min): a reduction that started from zeroed
    # memory instead of the first iteration would give 0 here
    x = rng.uniform(-3.0, -0.5, size=(3, 4, 128, 32)).astype(np.float32)
    if op is nl.minimum or op is np.multiply:
        x = -x
    out = nki.simulate_kernel(uninit_reduce_k, x, op=op)
    np.testing.assert_allclose(out, _blocks(ref(x.astype(np.float64), axis=1)), rtol=2e-6)


def test_never_initialised_bf16_accumulator_rounds_from_the_first_step(rng, sim_only):
    x = rng.uniform(-1, 1, size=(1, 3, 128, 16)).astype(np.float32)
    out = nki.simulate_kernel(uninit_reduce_k, x, op=np.add, acc_dtype=BF16)
    acc = x[0, 0].astype(BF16).astype(np.float64)          # the first iteration stores bf16(x)
    for k in (1, 2):
        acc = (acc.astype(np.float32) + x[0, k]).astype(BF16).astype(np.float64)
    np.testing.assert_array_equal(out, acc.astype(np.float32))


def test_never_initialised_accumulator_records_one_tensor_tensor_per_iteration(rng, sim_only):
    x = rng.uniform(0, 1, size=(2, 3, 128, 8)).astype(np.float32)
    with nki_sim.tracing() as trace:
        nki.simulate_kernel(uninit_reduce_k, x, op=np.max)
    ev = [e for e in trace.events if e.op == "tensor_tensor"]
    assert len(ev) == 6 and all(e.engine == "vector" and e.attr("alu") == "maximum" for e in ev)


@nki.jit
def uninit_misuse_k(x, *, mode):
    """acc is never initialised (or, for "partial", only its first 64 rows are)."""
    acc = nl.ndarray((128, 8), dtype=np.float32, buffer=nl.sbuf)
    if mode == "partial":
        acc[0:64, :] = 0.0
    i_p = nl.arange(128)[:, None]
    for k in nl.affine_range(2):
        t = nl.load(x[k])
        if mode == "iadd":
            acc[...] += t
        elif mode == "nl_add":
            acc[...] = nl.add(acc, t)
        elif mode == "tensor_tensor":
            acc[...] = nisa.tensor_tensor(acc, t, op=np.add)
        elif mode in ("masked", "masked_rows"):
            acc[...] = nl.loop_reduce(t, op=np.add, loop_indices=[k], mask=(i_p < 100))
        else:
            acc[...] = nl.loop_reduce(t, op=np.add, loop_indices=[k])
    out = nl.ndarray((128, 8), dtype=np.float32, buffer=nl.shared_hbm)
    if mode == "masked_rows":
        nl.store(out[0:100, :], acc[0:100, :])       # only the reduced rows
    else:
        nl.store(out, acc)
    return out


def test_masked_never_initialised_loop_reduce_writes_only_its_rows(rng, sim_only):
    x = rng.uniform(0, 1, size=(2, 128, 8)).astype(np.float32)
    out = nki.simulate_kernel(uninit_misuse_k, x, mode="masked_rows")
    np.testing.assert_allclose(out[:100], x[:, :100].astype(np.float64).sum(axis=0), rtol=1e-6)


@pytest.mark.parametrize("mode,match", [
    # an ordinary read-modify-write of a never-written accumulator reads garbage on hardware
    ("iadd", r"'add' reads 1024 never-written element\(s\) of tensor"),
    ("nl_add", r"'add' reads 1024 never-written"),
    ("tensor_tensor", r"never-written"),
    # a partly written accumulator: no first iteration to start from (64 rows never written)
    ("partial", r"nl.loop_reduce into a partly written accumulator.*reads 512 never-written"),
    # masked-out rows stay never written: storing them is still an uninitialised read
    ("masked", r"'store' reads 224 never-written"),
])
def test_never_initialised_accumulator_errors(rng, sim_only, rejects, mode, match):
    x = rng.uniform(0, 1, size=(2, 128, 8)).astype(np.float32)
    with rejects(nki_sim.errors.UninitializedReadError, match=match):
        nki.simulate_kernel(uninit_misuse_k, x, mode=mode)
