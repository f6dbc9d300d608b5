"""Event trace of kernel runs (nki_sim.tracing; the fields of nki_sim.trace.Event).

DMA expectations are derived here from the descriptor rule: one descriptor per
(partition, maximal contiguous run in HBM) of the transfer, sized by the run; masked-out
or skipped rows make no descriptor.
"""

from __future__ import annotations

import json
import pathlib
import sys

import ml_dtypes
import numpy as np
import pytest

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

import nki_sim

pytestmark = [pytest.mark.simulation, pytest.mark.usefixtures("sim_only")]


def _dma(trace):
    return [e for e in trace.events if e.engine == "dma"]


def _line_of(module, needle: str) -> int:
    lines = pathlib.Path(module.__file__).read_text().splitlines()
    hits = [i + 1 for i, line in enumerate(lines) if needle in line]
    assert len(hits) == 1, (needle, hits)
    return hits[0]


def test_three_indirect_gathers_descriptor_counts(indirect, rng):
    rows, width, n_gather, parts = 500, 96, 3, 128
    item = np.dtype(ml_dtypes.bfloat16).itemsize
    data = rng.standard_normal((rows, width)).astype(ml_dtypes.bfloat16)
    idx = rng.integers(0, rows, size=(parts, n_gather)).astype(np.int32)
    idx[:, 1] = np.arange(parts)            # contiguous rows still make one descriptor each
    with nki_sim.tracing() as trace:
        out = nki.simulate_kernel(indirect.three_gathers, data, idx)
    ref = np.concatenate([data[idx[:, j]] for j in range(n_gather)], axis=1)
    np.testing.assert_array_equal(out.view(np.uint16), ref.view(np.uint16))

    row_bytes = width * item                                  # 192
    idx_load = (parts, parts * n_gather * 4)                 # one 12-byte run per partition
    gathers = (n_gather * parts, n_gather * parts * row_bytes)   # 384 descriptors, 384*192 bytes
    store = (parts, parts * n_gather * row_bytes)            # one 576-byte run per partition

    indirect_events = [e for e in _dma(trace) if e.dma_kind == "indirect"]
    assert len(indirect_events) == n_gather
    assert sum(len(e.descriptor_bytes) for e in indirect_events) == gathers[0] == 384
    assert sum(e.bytes for e in indirect_events) == gathers[1] == 384 * 192
    for e in indirect_events:
        assert e.op == "load" and e.src_buffer == "hbm" and e.dst_buffer == "sbuf"
        assert e.descriptor_bytes == (row_bytes,) * parts
        assert e.partitions == parts and e.attr("index_rows") == parts and e.skipped_rows == 0
        assert e.src_loc == ("indirect_kernels.py",
                             _line_of(indirect, "acc[i_p, j * width + i_f] = nl.load("))
    assert sorted(e.loop_indices[-1] for e in indirect_events) == [0, 1, 2]

    s = trace.summary()
    assert s["dma_instructions"] == 5
    assert s["dma_indirect_instructions"] == 3 and s["dma_direct_instructions"] == 2
    assert s["dma_descriptors"] == idx_load[0] + gathers[0] + store[0] == 640
    assert s["dma_bytes"] == idx_load[1] + gathers[1] + store[1]
    assert s["engine_instructions"]["dma"] == 5


@pytest.mark.parametrize("keep", [32, 64])
def test_direct_strided_load_has_one_descriptor_per_run(indirect, rng, keep):
    parts, blocks, width = 128, 4, 64
    x = rng.standard_normal((parts, blocks, width)).astype(np.float32)
    with nki_sim.tracing() as trace:
        out = nki.simulate_kernel(indirect.strided_load, x, keep=keep)
    np.testing.assert_array_equal(out, x[:, :, :keep])
    load, store = _dma(trace)
    runs_per_partition = blocks if keep < width else 1       # full rows merge into one run
    run_bytes = keep * 4 * (blocks // runs_per_partition)
    assert load.dma_kind == "direct" and load.op == "load"
    assert load.descriptor_bytes == (run_bytes,) * (parts * runs_per_partition)
    assert load.bytes == parts * blocks * keep * 4
    assert store.descriptor_bytes == (blocks * keep * 4,) * parts    # SBUF->HBM contiguous
    assert trace.summary()["dma_descriptors"] == parts * runs_per_partition + parts


def test_oob_skip_rows_make_no_descriptor(indirect, rng):
    rows, width = 256, 64
    data = rng.standard_normal((rows, width)).astype(np.float32)
    idx = (3 * np.arange(128)).reshape(128, 1).astype(np.int32)
    valid = int((idx[:, 0] < rows).sum())                     # 86
    with nki_sim.tracing() as trace:
        nki.simulate_kernel(indirect.gather_rows_dma, data, idx, skip=True, fill=0.0)
    (copy,) = [e for e in _dma(trace) if e.dma_kind == "indirect"]
    assert copy.op == "dma_copy"
    assert copy.skipped_rows == 128 - valid
    assert copy.descriptor_bytes == (width * 4,) * valid
    assert copy.bytes == valid * width * 4
    assert trace.summary()["dma_descriptors"] == 128 + valid + 128   # idx load, gather, store


def test_masked_load_rows_make_no_descriptor(indirect, rng):
    x = rng.standard_normal((100, 24)).astype(np.float32)
    with nki_sim.tracing() as trace:
        nki.simulate_kernel(indirect.masked_load, x, fill=0.0)
    load = [e for e in _dma(trace) if e.op == "load"][0]
    assert load.descriptor_bytes == (24 * 4,) * 100 and load.bytes == 100 * 24 * 4


def test_spmd_events_carry_program_ids(tutorial, rng):
    a = rng.standard_normal((256, 512)).astype(np.float32)
    with nki_sim.tracing() as trace:
        nki.simulate_kernel(tutorial.spmd_tensor_add[2, 2], a, a)
    dma = _dma(trace)
    assert len(dma) == 4 * 3
    assert {e.program_id for e in dma} == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert all(e.descriptor_bytes == (256 * 4,) * 128 for e in dma)
    assert [e.seq for e in trace.events] == sorted(e.seq for e in trace.events)


@pytest.mark.parametrize("dtype,fp32", [(np.float32, True), (ml_dtypes.bfloat16, False)])
def test_matmul_events_and_summary_consistency(tutorial, rng, dtype, fp32):
    lhs_t = rng.standard_normal((384, 256)).astype(dtype)
    rhs = rng.standard_normal((384, 1024)).astype(dtype)
    with nki_sim.tracing() as trace:
        nki.simulate_kernel(tutorial.tiled_matmul, lhs_t, rhs)
    mms = [e for e in trace.events if e.op in ("matmul", "nc_matmul")]
    assert len(mms) == 2 * 2 * 3
    assert sorted(e.loop_indices for e in mms) == [(m, n, k) for m in range(2) for n in range(2)
                                                  for k in range(3)]
    for e in mms:
        assert e.engine == "tensor" and e.dst_buffer in ("", "psum")
        assert (e.attr("contraction"), e.attr("stationary_free"), e.attr("moving_free")) == (128, 128, 512)
        assert e.attr("fp32") is fp32
    s = trace.summary()
    assert s["instructions"] == len(trace.events)
    assert sum(s["engine_instructions"].values()) == s["instructions"]
    assert s["engine_instructions"]["tensor"] == len([e for e in trace.events if e.engine == "tensor"])
    assert s["dma_instructions"] == len(_dma(trace)) == 2 * 2 * 3 * 2 + 4
    assert 2048 <= s["peak_psum_bytes_per_partition"] <= 16 * 1024
    assert s["peak_sbuf_bytes_per_partition"] >= 128 * lhs_t.itemsize + 512 * rhs.itemsize


def test_chrome_json_export(tutorial, rng, tmp_path):
    x = rng.standard_normal((128, 64)).astype(np.float32)
    with nki_sim.tracing() as trace:
        nki.simulate_kernel(tutorial.row_softmax, x)
    path = tmp_path / "trace.json"
    doc = trace.to_chrome_json(str(path))
    on_disk = json.loads(path.read_text())
    assert on_disk == json.loads(json.dumps(doc))
    assert len(doc["traceEvents"]) >= len(trace.events) > 0


def test_tracing_records_nothing_outside_the_context(tutorial, rng):
    x = rng.standard_normal((128, 64)).astype(np.float32)
    with nki_sim.tracing() as trace:
        pass
    nki.simulate_kernel(tutorial.row_softmax, x)
    assert trace.events == [] or len(trace.events) == 0


@nki.jit
def hold_sbuf_tiles(x, *, n_tiles):
    """Keeps n_tiles (128, 1000) fp32 SBUF tiles (4000 B per partition each) alive at once."""
    out = nl.ndarray((128, 1000), dtype=nl.float32, buffer=nl.shared_hbm)
    held = []
    for _ in range(n_tiles):
        held.append(nl.load(x))
    acc = held[0]
    for t in held[1:]:
        acc = nl.maximum(acc, t)
    nl.store(out, value=acc)
    return out


@pytest.mark.parametrize("name,over", [("trn1", True), ("trn2", False)])
def test_peak_sbuf_checked_against_the_run_target(rng, target, name, over):
    # 50 live tiles = 200000 B per partition: above trn1's usable 180224 B, below trn2's 212984 B
    x = rng.standard_normal((128, 1000)).astype(np.float32)
    with target(name), nki_sim.tracing() as trace:
        nki.simulate_kernel(hold_sbuf_tiles, x, n_tiles=50)
    s = trace.summary()                      # asked after leaving the target context
    assert s["peak_sbuf_bytes_per_partition"] >= 50 * 4000
    assert s["target"] == name
    assert s["sbuf_over_capacity"] is over


@nki.jit
def gather_strided_k(data, idx, *, step, cols):
    """Gather rows idx[p] of data, keeping columns 0, step, 2*step, ... (cols of them)."""
    out = nl.ndarray((idx.shape[0], cols), dtype=data.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(idx.shape[0])[:, None]
    i_f = nl.arange(cols)[None, :]
    idx_tile = nl.load(idx)
    nl.store(out, value=nl.load(data[idx_tile[i_p, 0], step * i_f]))
    return out


@pytest.mark.parametrize("step", [1, 2])
def test_indirect_gather_of_strided_columns_counts_every_run(rng, step):
    data = rng.standard_normal((40, 64)).astype(np.float32)
    idx = rng.integers(0, 40, size=(128, 1)).astype(np.int32)
    with nki_sim.tracing() as trace:
        out = nki.simulate_kernel(gather_strided_k, data, idx, step=step, cols=32)
    np.testing.assert_array_equal(out, data[idx[:, 0]][:, ::step][:, :32])
    (gather,) = [e for e in _dma(trace) if e.dma_kind == "indirect"]
    if step == 1:   # one contiguous 128-byte run per gathered row
        assert gather.descriptor_bytes == (32 * 4,) * 128
    else:           # every element is its own run
        assert gather.descriptor_bytes == (4,) * (128 * 32)
    assert gather.bytes == 128 * 32 * 4


def test_indirect_scatter_descriptors(indirect, rng):
    src = rng.standard_normal((128, 40)).astype(np.float32)
    idx = rng.permutation(384)[:128].reshape(128, 1).astype(np.int32)
    with nki_sim.tracing() as trace:
        nki.simulate_kernel(indirect.scatter_rows, src, idx, nrows=384)
    (scatter,) = [e for e in _dma(trace) if e.dma_kind == "indirect"]
    assert scatter.op == "store" and scatter.src_buffer == "sbuf" and scatter.dst_buffer == "hbm"
    assert scatter.descriptor_bytes == (40 * 4,) * 128
    zero_stores = [e for e in _dma(trace) if e.op == "store" and e.dma_kind == "direct"]
    assert len(zero_stores) == 3 and all(e.descriptor_bytes == (160,) * 128 for e in zero_stores)


@nki.jit
def strided_store_k(x, *, blocks, keep):
    """x (P, blocks*keep) -> out (P, blocks, 2*keep) with x written into out[:, :, :keep]
    (the rest zero): each partition's store has ``blocks`` runs in HBM."""
    out = nl.ndarray((x.shape[0], blocks, 2 * keep), dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.zeros((x.shape[0], blocks, 2 * keep), dtype=x.dtype))
    tile = nl.load(x).reshape((x.shape[0], blocks, keep))
    nl.store(out[:, :, 0:keep], value=tile)
    return out


def test_strided_store_has_one_descriptor_per_run(rng):
    x = rng.standard_normal((64, 4 * 16)).astype(np.float32)
    with nki_sim.tracing() as trace:
        out = nki.simulate_kernel(strided_store_k, x, blocks=4, keep=16)
    ref = np.zeros((64, 4, 32), np.float32)
    ref[:, :, :16] = x.reshape(64, 4, 16)
    np.testing.assert_array_equal(out, ref)
    zero_store, load, store = _dma(trace)
    assert zero_store.descriptor_bytes == (4 * 32 * 4,) * 64
    assert load.descriptor_bytes == (64 * 4,) * 64
    assert store.descriptor_bytes == (16 * 4,) * (64 * 4)


@nki.jit
def engines_k(x, bias):
    """One instruction of each kind whose engine is documented."""
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    tile = nl.load(x)
    b = nl.load(bias)
    act = nisa.activation(op=nl.exp, data=tile, bias=b, scale=1.0, name="act")
    idx = nisa.iota(nl.arange(x.shape[0])[:, None] + nl.arange(x.shape[1])[None, :], dtype=nl.float32)
    sel = nisa.affine_select(pred=(nl.arange(x.shape[1])[None, :] < 8), on_true_tile=act,
                             on_false_value=0.0)
    tt = nisa.tensor_tensor(sel, idx, op=np.add)
    rec = nisa.reciprocal(tt)
    red = nisa.tensor_reduce(np.max, rec, axis=(1,), keepdims=True)
    prod = nisa.nc_matmul(tile, tile)                    # (F, F) in PSUM
    cp = nisa.tensor_copy(red, engine=nisa.gpsimd_engine)
    nl.store(out, value=nl.add(nl.multiply(rec, cp), nl.copy(prod[0:x.shape[0], 0:x.shape[1]])))
    return out


def test_engines_of_documented_instructions(rng):
    x = rng.uniform(0.5, 1.0, size=(32, 32)).astype(np.float32)
    bias = np.zeros((32, 1), np.float32)
    with nki_sim.tracing() as trace:
        nki.simulate_kernel(engines_k, x, bias)
    by_op = {}
    for e in trace.events:
        by_op.setdefault(e.op, set()).add(e.engine)
    assert by_op["activation"] == {"scalar"}
    assert by_op["iota"] == {"gpsimd"}
    assert by_op["affine_select"] == {"gpsimd"}
    assert by_op["tensor_tensor"] == {"vector"}
    assert by_op["reciprocal"] == {"vector"}
    assert by_op["tensor_reduce"] == {"vector"}
    assert by_op["nc_matmul"] == {"tensor"}
    # nisa.tensor_copy(engine=gpsimd); nl.copy records a tensor_copy whose engine the compiler picks
    assert {e.engine for e in trace.events if e.op == "tensor_copy"
            and not e.attr("engine_unspecified")} == {"gpsimd"}
    (act,) = [e for e in trace.events if e.op == "activation"]
    assert act.name == "act" and act.partitions == 32 and act.free_elems == 32
    assert act.out_shape == (32, 32) and act.in_dtypes[0] == "float32"
    assert act.out_dtype == "float32" and act.bytes == 32 * 32 * 4          # compute: bytes written
    (mm,) = [e for e in trace.events if e.op == "nc_matmul"]
    assert (mm.attr("contraction"), mm.attr("stationary_free"), mm.attr("moving_free")) == (32, 32, 32)


def test_hbm_contiguous_attr_on_dma_events(indirect, rng):
    # attrs["hbm_contiguous"]: True iff the HBM side is one contiguous byte range in
    # (partition, free) order; False for indirect DMAs and strided views
    x = rng.standard_normal((128, 4, 64)).astype(np.float32)
    with nki_sim.tracing() as trace:
        nki.simulate_kernel(indirect.strided_load, x, keep=64)      # whole tensor: contiguous
        nki.simulate_kernel(indirect.strided_load, x, keep=32)      # strided view
    full_load, full_store, part_load, part_store = _dma(trace)
    assert full_load.attr("hbm_contiguous") is True and full_store.attr("hbm_contiguous") is True
    assert part_load.attr("hbm_contiguous") is False and part_store.attr("hbm_contiguous") is True
    data = rng.standard_normal((300, 8)).astype(np.float32)
    idx = np.arange(128, dtype=np.int32).reshape(128, 1)              # even consecutive rows
    with nki_sim.tracing() as trace:
        nki.simulate_kernel(indirect.gather_rows, data, idx)
    (gather,) = [e for e in _dma(trace) if e.dma_kind == "indirect"]
    assert not gather.attr("hbm_contiguous", False)


@nki.jit
def hold_psum_tiles(x, *, n_tiles):
    """Keeps n_tiles (128, 512) fp32 PSUM tiles (one 2 KiB bank each) alive at once."""
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    held = []
    for _ in range(n_tiles):
        t = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        t[...] = nl.load(x)
        held.append(t)
    acc = nl.copy(held[0])
    for t in held[1:]:
        acc = nl.add(acc, t)
    nl.store(out, value=acc)
    return out


@pytest.mark.parametrize("n_tiles,over", [(8, False), (9, True)])
def test_peak_psum_against_eight_banks(rng, n_tiles, over):
    x = rng.standard_normal((128, 512)).astype(np.float32)
    with nki_sim.tracing() as trace:
        nki.simulate_kernel(hold_psum_tiles, x, n_tiles=n_tiles)
    s = trace.summary()
    assert s["peak_psum_bytes_per_partition"] >= n_tiles * 2048
    assert s["psum_over_capacity"] is over


class _EveryDepthOutermostFirst(dict):
    """A stand-in for the remembered kernel-frame depths: for every caller, depths 60 .. 1."""

    def get(self, key, default=None):
        return list(range(60, 0, -1))

    def setdefault(self, key, default=None):
        return []


def test_src_loc_never_lands_on_the_code_that_launched_the_kernel(indirect, rng, monkeypatch):
    # the remembered-depth shortcut may offer the frame that called simulate_kernel (outside
    # nki_sim, with nki_sim below it); it must be refused for the kernel's own line
    from nki_sim import trace as tr

    monkeypatch.setattr(tr, "_depths", _EveryDepthOutermostFirst())
    monkeypatch.setattr(tr, "_kernel_side", {})
    data = rng.standard_normal((64, 96)).astype(ml_dtypes.bfloat16)
    idx = rng.integers(0, 64, size=(128, 3)).astype(np.int32)
    with nki_sim.tracing() as trace:
        nki.simulate_kernel(indirect.three_gathers, data, idx)
    locs = {e.src_loc for e in _dma(trace) if e.dma_kind == "indirect"}
    assert locs == {("indirect_kernels.py", _line_of(indirect, "acc[i_p, j * width + i_f] = nl.load("))}


def test_call_sites_past_attributes_a_helpers_events_to_its_caller(helper_ops):
    def _through_helper(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        u = helper_ops.doubled(t)                   # the helper's event: call site here
        nl.store(out, u)
        return out

    a = np.arange(128 * 8, dtype=np.float32).reshape(128, 8)
    here = ("test_api_trace.py", _line_of(sys.modules[__name__], "the helper's event" + ": call site"))
    helper = ("helper_ops.py", _line_of(helper_ops, "return nl.multiply(t, 2.0)"))
    with nki_sim.tracing() as plain:
        np.testing.assert_array_equal(nki.simulate_kernel(_through_helper, a), 2 * a)
    with nki_sim.tracing(call_sites_past=("helper_ops",)) as sites:
        nki.simulate_kernel(_through_helper, a)
    compute = lambda tr: [e.src_loc for e in tr.events if e.engine != "dma"]  # noqa: E731
    assert compute(plain) == [helper]                   # must-fail side: the helper's own line
    assert compute(sites) == [here]                     # must-pass: the line that called it
    dma = lambda tr: [e.src_loc for e in tr.events if e.engine == "dma"]  # noqa: E731
    assert dma(plain) == dma(sites)                     # the kernel's own lines are unchanged
