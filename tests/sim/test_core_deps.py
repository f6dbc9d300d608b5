"""affine_range loop-carried dependency checker: each case has a must-pass twin."""

from __future__ import annotations

import numpy as np
import pytest

import nki_sim
from nki_sim import errors as E

from test_core_helpers import f32, nisa, nl, run


def _waw(x, *, loop):
    out = nl.ndarray((128, 64), x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((128, 64), x.dtype)                 # allocated outside the loop
    for i in loop(4):
        t[...] = nl.load(x[nl.ds(i * 128, 128), :])    # same destination every iteration
    nl.store(out, t)
    return out


def test_write_after_write_across_iterations_fails(rng):
    with pytest.raises(SyntaxError, match=r"^Unexpected output dependencies, missing indices in the dst access: i "):
        run(_waw, f32(rng, 512, 64), loop=nl.affine_range)


def test_same_loop_as_sequential_range_passes(rng):
    x = f32(rng, 512, 64)
    assert np.array_equal(run(_waw, x, loop=nl.sequential_range), x[384:])


def _indexed(x):
    out = nl.ndarray((128, 256), x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((128, 256), x.dtype)
    for i in nl.affine_range(4):
        t[:, nl.ds(i * 64, 64)] = nl.load(x[:, nl.ds(i * 64, 64)])   # disjoint per iteration
    nl.store(out, t)
    return out


def test_disjoint_writes_pass(rng):
    x = f32(rng, 128, 256)
    assert np.array_equal(run(_indexed, x), x)


def _fresh(x):
    out = nl.ndarray((512, 64), x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(4):
        t = nl.ndarray((128, 64), x.dtype)             # fresh per iteration: not a dependency
        t[...] = nl.load(x[nl.ds(i * 128, 128), :])
        t[...] = nl.multiply(t, 2.0)
        nl.store(out[nl.ds(i * 128, 128), :], t)
    return out


def test_tensor_allocated_inside_body_is_fresh(rng):
    x = f32(rng, 512, 64)
    assert np.array_equal(run(_fresh, x), 2 * x)


def _psum_acc(a, b, *, op):
    out = nl.ndarray((64, 128), nl.float32, buffer=nl.shared_hbm)
    ps = nl.zeros((64, 128), nl.float32, buffer=nl.psum)
    for k in nl.affine_range(a.shape[0] // 128):
        at = nl.load(a[nl.ds(k * 128, 128), :])
        bt = nl.load(b[nl.ds(k * 128, 128), :])
        if op == "+=":
            ps += nisa.nc_matmul(at, bt)
        else:                                          # accumulate with a plain add: a dependency
            ps[...] = nl.add(ps, nisa.nc_matmul(at, bt))
    nl.store(out, nl.copy(ps))
    return out


def test_psum_matmul_accumulation_passes(rng):
    a, b = f32(rng, 384, 64), f32(rng, 384, 128)
    out = run(_psum_acc, a, b, op="+=")
    np.testing.assert_allclose(out, a.astype(np.float64).T @ b, rtol=1e-4, atol=1e-4)


def test_psum_accumulation_without_plus_equals_fails(rng):
    with pytest.raises(E.OutputDependencyError, match="missing indices in the dst access: k"):
        run(_psum_acc, f32(rng, 384, 64), f32(rng, 384, 128), op="add")


def _raw(x, *, shift):
    out = nl.ndarray((128, 4), x.dtype, buffer=nl.shared_hbm)
    buf = nl.zeros((128, 8), x.dtype)
    for i in nl.affine_range(4):
        buf[:, nl.ds(2 * i, 2)] = nl.load(x[:, nl.ds(2 * i, 2)])
        if shift and i > 0:
            prev = nl.copy(buf[:, nl.ds(2 * i - 2, 2)])   # reads what iteration i-1 wrote
            nl.store(out[:, 0:2], prev)
    if not shift:
        nl.store(out, buf[:, 0:4])
    return out


def test_read_after_write_across_iterations_fails(rng):
    with pytest.raises(E.OutputDependencyError, match="'copy' reads tensor .* iteration 1 .* iteration 0 wrote it"):
        run(_raw, f32(rng, 128, 8), shift=True)


def test_read_own_iteration_passes(rng):
    x = f32(rng, 128, 8)
    assert np.array_equal(run(_raw, x, shift=False), x[:, :4])


def _war(x):
    out = nl.ndarray((128, 2), x.dtype, buffer=nl.shared_hbm)
    buf = nl.zeros((128, 8), x.dtype)
    for i in nl.affine_range(3):
        nxt = nl.copy(buf[:, nl.ds(2 * i + 2, 2)])      # reads the slot iteration i+1 writes
        buf[:, nl.ds(2 * i, 2)] = nl.load(x[:, nl.ds(2 * i, 2)])
        nl.store(out, nxt)
    return out


def test_write_after_read_across_iterations_fails(rng):
    with pytest.raises(E.OutputDependencyError, match="iteration 0 read it"):
        run(_war, f32(rng, 128, 8))


def _nested(x, *, inner_indexed):
    out = nl.ndarray((128, 8), x.dtype, buffer=nl.shared_hbm)
    buf = nl.zeros((128, 8), x.dtype)
    for i in nl.affine_range(2):
        for j in nl.affine_range(4):
            col = i * 4 + j if inner_indexed else j        # missing i: outer iterations collide
            buf[:, nl.ds(col, 1)] = nl.load(x[:, nl.ds(i * 4 + j, 1)])
    nl.store(out, buf)
    return out


def test_nested_affine_loops(rng):
    x = f32(rng, 128, 8)
    assert np.array_equal(run(_nested, x, inner_indexed=True), x)
    with pytest.raises(E.OutputDependencyError, match="dst access: i "):
        run(_nested, x, inner_indexed=False)


def test_checker_can_be_disabled(rng):
    with nki_sim.configure(check_dependencies=False):
        run(_waw, f32(rng, 512, 64), loop=nl.affine_range)


def _reduce_into_column(x):
    out = nl.ndarray((128, 4), nl.float32, buffer=nl.shared_hbm)
    mx = nl.ndarray((128, 4), nl.float32)
    for k in nl.affine_range(4):
        t = nl.load(x[:, nl.ds(k * 32, 32)])
        mx[:, k] = nisa.tensor_reduce(np.max, t, axis=(1,), dtype=nl.float32)
    nl.store(out, mx)
    return out


def test_reduction_into_loop_indexed_column_passes(rng):
    x = f32(rng, 128, 128)
    assert np.array_equal(run(_reduce_into_column, x), x.reshape(128, 4, 32).max(axis=2))


def _scope(x, *, inside):
    out = nl.ndarray((128, 8), x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(2):
        t = nl.load(x[:, nl.ds(8 * i, 8)])               # allocated inside the loop body
        if inside:
            nl.store(out, t, mask=(i == 1))
    if not inside:
        nl.store(out, t)                                  # used after the loop: out of scope
    return out


def test_tensor_used_after_its_loop_is_out_of_scope(rng):
    x = f32(rng, 128, 16)
    assert np.array_equal(run(_scope, x, inside=True), x[:, 8:])
    with pytest.raises(E.NkiCompileError, match="err_local_variable_used_out_of_scope"):
        run(_scope, x, inside=False)
    with nki_sim.configure(check_scope=False):
        assert np.array_equal(run(_scope, x, inside=False), x[:, 8:])


def test_errors_carry_the_kernel_context(rng):
    with pytest.raises(E.OutputDependencyError) as info:
        run(_waw, f32(rng, 512, 64), loop=nl.affine_range, grid=(1, 2))
    assert str(info.value).startswith("Unexpected output dependencies")      # documented text intact
    assert not getattr(info.value, "__notes__", None)
    assert info.value.nki_context.startswith(
        "kernel '_waw', program_id (0, 0), enclosing loops: affine_range=1 at test_core_deps.py:")


def _make_out(shape, dtype):
    return nl.ndarray(shape, dtype, buffer=nl.shared_hbm)


def _out_top(x):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.load(x))
    return out


def _out_in_if(x):
    if nl.program_id(0) >= 0:
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.load(x))
    return out


def _out_in_const_if(x, *, flag):
    if flag and x.shape[0] > 0:              # decided by Python before the front end sees it
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.load(x))
    return out


def _out_in_helper(x):
    out = _make_out(x.shape, x.dtype)
    nl.store(out, nl.load(x))
    return out


def _out_in_loop(x):
    for i in nl.sequential_range(1):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.load(x))
    return out


def test_shared_hbm_only_at_kernel_top_level(rng):
    x = f32(rng, 4, 4)
    assert np.array_equal(run(_out_top, x), x)
    assert np.array_equal(run(_out_in_const_if, x, flag=True), x)
    for k, where in ((_out_in_if, "inside an if on the SPMD program id"), (_out_in_helper, "inside function '_make_out'"),
                     (_out_in_loop, "inside an NKI loop")):
        with pytest.raises(E.NkiCompileError, match=f"err_shared_hbm_must_in_kernel_level|{where}") as info:
            run(k, x)
        assert where in str(info.value) and "err_shared_hbm_must_in_kernel_level" in str(info.value)


def _random_writes(x, *, spans):
    out = nl.ndarray((8, 64), x.dtype, buffer=nl.shared_hbm)
    buf = nl.zeros((8, 64), x.dtype)
    for i in nl.affine_range(len(spans)):
        lo, n = spans[i]
        buf[:, nl.ds(lo, n)] = nl.load(x[:, nl.ds(lo, n)])
    nl.store(out, buf)
    return out


def test_dependency_checker_matches_naive_overlap_rule():
    """Random per-iteration write spans: an error iff two different iterations write one column."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    span = st.tuples(st.integers(0, 60), st.integers(1, 4))

    @settings(max_examples=60, deadline=None)
    @given(spans=st.lists(span, min_size=1, max_size=5))
    def check(spans):
        owner, overlap = {}, False
        for i, (lo, n) in enumerate(spans):
            for c in range(lo, lo + n):
                overlap |= owner.setdefault(c, i) != i
        x = np.arange(8 * 64, dtype=np.float32).reshape(8, 64)
        if overlap:
            with pytest.raises(E.OutputDependencyError):
                run(_random_writes, x, spans=spans)
        else:
            out = run(_random_writes, x, spans=spans)
            cols = sorted(owner)
            assert np.array_equal(out[:, cols], x[:, cols])
    check()


def _python_if_on_loop_var(x, *, loop):
    out = nl.ndarray((128, 8), x.dtype, buffer=nl.shared_hbm)
    for i in loop(2):
        t = nl.load(x[:, nl.ds(4 * i, 4)])
        if i == 0:                                        # Python decision on a loop variable
            t = nl.multiply(t, 2.0)
        nl.store(out[:, nl.ds(4 * i, 4)], t, mask=(i >= 0))   # as mask=: fine
    return out


def test_traced_loops_flag_python_control_flow_on_loop_variables(rng):
    x = f32(rng, 128, 8)
    ref = x.copy()
    ref[:, :4] *= 2
    assert np.array_equal(run(_python_if_on_loop_var, x, loop=nl.affine_range), ref)     # default: off
    with nki_sim.configure(traced_loops="warn"), pytest.warns(RuntimeWarning, match="i == 0"):
        assert np.array_equal(run(_python_if_on_loop_var, x, loop=nl.affine_range), ref)
    with nki_sim.configure(traced_loops="error"):
        with pytest.raises(E.NkiCompileError, match="traces nl.affine_range"):
            run(_python_if_on_loop_var, x, loop=nl.sequential_range)
        assert np.array_equal(run(_python_if_on_loop_var, x, loop=nl.static_range), ref)
