"""Event trace: schema, descriptor rule, summary, Chrome export."""

from __future__ import annotations

import dataclasses
import inspect
import json

import ml_dtypes
import numpy as np
import pytest

import nki_sim
from nki_sim.trace import Event

from test_core_helpers import f32, nisa, nl, run

REQUIRED_FIELDS = ["seq", "engine", "op", "name", "in_shapes", "out_shape", "in_dtypes", "out_dtype",
                   "partitions", "free_elems", "bytes", "src_loc", "loop_indices", "program_id",
                   "dma_kind", "src_buffer", "dst_buffer", "descriptor_bytes", "skipped_rows", "attrs",
                   "launch"]


def test_event_schema_is_frozen_with_contract_fields():
    assert [f.name for f in dataclasses.fields(Event)] == REQUIRED_FIELDS
    e = Event(0, "dma", "load", "", (), (), (), "", 1, 1, 4, ("k.py", 1), (), (), attrs=(("a", 1),))
    assert e.attr("a") == 1 and e.attr("b", 7) == 7
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.op = "x"


def _loads(x, kv, idx):
    out = nl.ndarray((128, 64), x.dtype, buffer=nl.shared_hbm)
    a = nl.load(x)                                      # 128 x 512 fp32 contiguous rows
    b = nl.load(x[:, 0:64])                             # strided: 128 runs of 256 B
    i_p = nl.arange(64)[:, None]
    i_f = nl.arange(128)[None, :]
    c = nl.load(x[i_f, i_p])                            # transposed access: one element per run
    it = nl.load(idx)                                   # (128, 1) int32
    kvf = kv.reshape((kv.shape[0] * kv.shape[1], kv.shape[2] * kv.shape[3]))
    j_p = nl.arange(128)[:, None]
    j_f = nl.arange(kvf.shape[1])[None, :]
    g = nl.load(kvf[it[j_p, 0], j_f])                   # indirect: 128 rows of b'*d contiguous
    h = nl.load(x[j_p, nl.arange(512)[None, :]], mask=(j_p < 100))   # masked rows: no descriptor
    nl.store(out, nl.add(b, nl.copy(a[:, 0:64])))
    return out


def test_descriptor_rule_counts(rng):
    x = f32(rng, 128, 512)
    kv = rng.standard_normal((40, 2, 8, 16)).astype(ml_dtypes.bfloat16)     # (N, Hkv, b', d)
    idx = rng.integers(0, 80, (128, 1)).astype(np.int32)
    with nki_sim.tracing() as tr:
        run(_loads, x, kv, idx)
    loads = [e for e in tr.events if e.op == "load"]
    a, b, c, it, g, h = loads
    assert a.descriptor_bytes == (2048,) * 128 and a.bytes == 128 * 512 * 4 and a.attr("hbm_contiguous")
    assert b.descriptor_bytes == (256,) * 128 and not b.attr("hbm_contiguous")
    assert len(c.descriptor_bytes) == 64 * 128 and set(c.descriptor_bytes) == {4}
    assert it.descriptor_bytes == (4,) * 128
    assert g.dma_kind == "indirect" and g.descriptor_bytes == (8 * 16 * 2,) * 128
    assert g.attr("index_rows") == 128 and g.partitions == 128 and g.free_elems == 128
    assert h.descriptor_bytes == (2048,) * 100 and h.bytes == 100 * 2048
    s = tr.summary()
    assert s["dma_instructions"] == 7
    assert s["dma_indirect_instructions"] == 1 and s["dma_direct_instructions"] == 6
    assert s["dma_descriptors"] == sum(len(e.descriptor_bytes) for e in tr.events if e.engine == "dma")
    assert s["dma_bytes"] == sum(e.bytes for e in tr.events if e.engine == "dma")
    assert s["engine_instructions"]["dma"] == 7 and s["instructions"] == len(tr.events)


def _loop_kernel(a, b):
    out = nl.ndarray((64, 128), nl.float32, buffer=nl.shared_hbm)
    ps = nl.zeros((64, 128), nl.float32, buffer=nl.psum)
    for k in nl.affine_range(2):
        at = nl.load(a[nl.ds(k * 128, 128), :], name="a_tile")
        bt = nl.load(b[nl.ds(k * 128, 128), :])
        ps += nisa.nc_matmul(at, bt)
    e = nisa.activation(np.exp, ps, scale=0.5)
    nl.store(out, e)
    return out


def test_events_carry_location_loops_program_and_attrs(rng):
    a, b = f32(rng, 256, 64), f32(rng, 256, 128)
    with nki_sim.tracing() as tr:
        out = run(_loop_kernel, a, b, grid=(1, 2))
    np.testing.assert_allclose(out, np.exp(0.5 * (a.astype(np.float64).T @ b)), rtol=1e-4)
    ev = tr.events
    assert [e.seq for e in ev] == list(range(len(ev)))
    mm = [e for e in ev if e.op == "nc_matmul"]
    assert len(mm) == 4 and [e.program_id for e in mm] == [(0, 0), (0, 0), (0, 1), (0, 1)]
    assert [e.loop_indices for e in mm] == [(0,), (1,), (0,), (1,)]
    m = mm[0]
    assert (m.engine, m.attr("contraction"), m.attr("stationary_free"), m.attr("moving_free"),
            m.attr("fp32")) == ("tensor", 128, 64, 128, True)
    assert m.out_shape == (64, 128) and m.in_dtypes == ("float32", "float32") and m.free_elems == 128
    line = inspect.getsourcelines(_loop_kernel)[1] + 6
    assert m.src_loc == ("test_core_trace.py", line)
    named = [e for e in ev if e.name == "a_tile"]
    assert len(named) == 4 and named[0].src_buffer == "hbm" and named[0].dst_buffer == "sbuf"
    act = [e for e in ev if e.op == "activation"][0]
    assert act.engine == "scalar" and act.partitions == 64 and act.free_elems == 128
    assert act.attr("func") == "exp" and act.attr("reduce") is None
    st = [e for e in ev if e.op == "store"][0]
    assert st.src_buffer == "sbuf" and st.dst_buffer == "hbm"
    memsets = [e for e in ev if e.op == "memset"]
    assert len(memsets) == 2                  # nl.zeros on PSUM, once per program


def test_activation_reduce_and_transpose_attrs(rng):
    def k(x):
        t = nl.load(x)
        s = nl.ndarray((32, 1), nl.float32)
        p = nisa.activation_reduce(np.exp, t, reduce_op=np.add, reduce_res=s, dtype=nl.bfloat16)
        tt = nisa.nc_transpose(nl.copy(p))
        out = nl.ndarray((32, 1), nl.float32, buffer=nl.shared_hbm)
        nl.store(out, s)
        del tt
        return out
    x = f32(rng, 32, 16)
    with nki_sim.tracing() as tr:
        out = run(k, x)
    np.testing.assert_allclose(out[:, 0], np.exp(x.astype(np.float64)).sum(1), rtol=1e-5)
    ar = [e for e in tr.events if e.op == "activation_reduce"][0]
    assert ar.attr("reduce") is True and ar.attr("func") == "exp" and ar.out_dtype == "bfloat16"
    tp = [e for e in tr.events if e.op == "nc_transpose"][0]
    assert tp.engine == "tensor" and tp.attr("contraction") == 32 and tp.attr("stationary_free") == 16


def test_chrome_json_export(tmp_path, rng):
    with nki_sim.tracing() as tr:
        run(_loop_kernel, f32(rng, 256, 64), f32(rng, 256, 128))
    p = tmp_path / "t.json"
    doc = tr.to_chrome_json(str(p))
    assert json.loads(p.read_text()) == doc
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == len(tr.events)
    assert {e["tid"] for e in xs} <= {0, 1, 2, 3, 4}


def test_no_events_outside_tracing(rng):
    with nki_sim.tracing() as tr:
        pass
    run(_loop_kernel, f32(rng, 256, 64), f32(rng, 256, 128))
    assert tr.events == []


def test_dma_transpose_descriptors_follow_source_rows(rng):
    def k(x):
        t = nl.load(x)
        tt = nisa.dma_transpose(t)
        out = nl.ndarray(tt.shape, tt.dtype, buffer=nl.shared_hbm)
        nl.store(out, tt)
        return out
    x = rng.standard_normal((64, 32)).astype(ml_dtypes.bfloat16)
    with nki_sim.use_target("trn2"), nki_sim.tracing() as tr:
        out = run(k, x)
    assert np.array_equal(out, x.T)
    ev = [e for e in tr.events if e.op == "dma_transpose"][0]
    assert ev.descriptor_bytes == (64,) * 64 and ev.attr("transpose") is True
    assert ev.src_buffer == "sbuf" and ev.dst_buffer == "sbuf" and ev.partitions == 32


def test_summary_uses_the_target_of_the_run():
    def k(x):
        big = nl.zeros((128, 50000), nl.float32)     # 200000 B / partition: > trn1, < trn2 usable
        out = nl.ndarray((1, 1), nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.copy(big[0:1, 0:1]))
        return out
    x = np.zeros((1, 1), np.float32)
    with nki_sim.use_target("trn1"), nki_sim.tracing() as tr1:
        run(k, x)
    with nki_sim.tracing() as tr2:
        run(k, x)
    s1, s2 = tr1.summary(), tr2.summary()
    assert (s1["target"], s1["sbuf_over_capacity"]) == ("trn1", True)
    assert (s2["target"], s2["sbuf_over_capacity"]) == ("trn2", False)
    assert s1["peak_sbuf_bytes_per_partition"] >= 200000


def test_tensor_engine_results_assigned_to_sbuf_count_the_evacuation_copy(rng):
    def k(x, *, dst_buffer):
        t = nl.load(x)
        d = nl.ndarray((x.shape[1], x.shape[0]), x.dtype, buffer=getattr(nl, dst_buffer))
        d[...] = nl.transpose(t)
        out = nl.ndarray(d.shape, x.dtype, buffer=nl.shared_hbm)
        nl.store(out, d if dst_buffer == "sbuf" else nl.copy(d))
        return out
    x = f32(rng, 16, 8)
    # the inserted PSUM -> SBUF evacuation is an implicit copy; nl.copy is the tensor_copy it
    # lowers to, on the engine the compiler picks
    for buf, copies in (("sbuf", [("copy", True)]), ("psum", [("tensor_copy", None)])):
        with nki_sim.tracing() as tr:
            assert np.array_equal(run(k, x, dst_buffer=buf), x.T)
        got = [(e.op, e.attr("implicit")) for e in tr.events if e.op in ("copy", "tensor_copy")]
        assert got == copies
