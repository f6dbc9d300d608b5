"""The dense vLLM-interface kernel on both physical cores of a trn2 logical core (LNC=2): the KV
heads split between the cores (current API: each core loops over its half, an odd Hkv's last
head split by query tiles; legacy API: ``[1, nl.spmd_dim(nl.nc(2), Hkv/2)]``, an odd Hkv
``[nl.nc(2), Hkv]`` with every head split by query tiles), outputs bit-identical to LNC=1
and within tolerance of the float64 reference, garbage in unseen cache slots never reaching the
output, the modeled launch time being the slower core's, the platform's LNC as the default of
both host entry points, and two cores refused where they cannot run."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import ml_dtypes
import numpy as np
import pytest

import nki_sim
from host.attention import flash_attn_varlen_nkifunc, paged_attention
from host.reference import paged_attention_ref
from nki_kernels import toolchain
from nki_sim import cost

pytestmark = [pytest.mark.simulation,
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]
QLENS, CLENS = [130, 1, 3], [700, 1500, 40]
BF16 = np.dtype(ml_dtypes.bfloat16)


def _run(b, api, lnc, kv_cache=None, mixed=True, **kw):
    with nki_sim.use_target("trn2"), nki_sim.tracing() as trace:
        out = paged_attention(b.query, b.key, b.value,
                              b.kv_cache if kv_cache is None else kv_cache, b.block_tables,
                              b.query_lens, b.context_lens, kernel="dense", backend="sim",
                              large_tile_size=512, mixed_precision=mixed, api=api, lnc=lnc,
                              **kw)
    return out, trace


@pytest.mark.parametrize("api, hkv, dtype", [
    ("nki", 2, BF16), ("nki", 4, np.float32), ("nki", 3, BF16), ("nki", 1, np.float32),
    ("legacy", 2, BF16), ("legacy", 4, np.float32), ("legacy", 3, BF16),
    ("legacy", 1, np.float32)])
def test_two_cores_match_one_core_and_the_reference(batch_factory, tol, api, hkv, dtype):
    b = batch_factory(61, QLENS, CLENS, H=2 * hkv, Hkv=hkv, d=32, block_size=16, dtype=dtype)
    mixed = dtype == BF16
    one, t1 = _run(b, api, 1, mixed=mixed)
    two, t2 = _run(b, api, 2, mixed=mixed)
    assert two.tobytes() == one.tobytes()                  # the same arithmetic per head
    atol, rtol = tol("mixed" if mixed else "fp32", dtype)
    ref = paged_attention_ref(*b.args())
    assert np.all(np.abs(two.astype(np.float64) - ref) <= atol + rtol * np.abs(ref))
    cores = {e.attr("core", 0) for e in t2.events}
    assert cores == {0, 1}
    rep1, rep2 = (cost.estimate_cores(t, "trn2") for t in (t1, t2))
    per = [r.modeled_us for r in rep2.per_core.values()]
    assert rep2.launch_us == pytest.approx(max(per))
    ratio = rep2.launch_us / rep1.launch_us
    if hkv % 2 == 0:                # each core runs half of the heads
        assert 0.45 < ratio < 0.55
    elif api == "nki":              # floor(Hkv / 2) heads and half of the last head's Q tiles
        assert _stores(t1)[0] >= 2 * 2 * hkv                 # >= 2 Q tiles per query head
        half, whole = (hkv // 2 + 0.5) / hkv, (hkv // 2 + 1) / hkv
        assert half - 0.05 < ratio < whole - 0.05            # below the whole last head on both
    else:                           # legacy: every head, half of its Q tiles on each core
        assert _stores(t1)[0] >= 2 * 2 * hkv
        assert 0.45 < ratio < 0.95                           # both cores load every head's KV


def _stores(trace):
    """Output tile stores (DMAs into HBM) per core."""
    n = {}
    for e in trace.events:
        if e.engine == "dma" and e.dst_buffer == "hbm":
            n[e.attr("core", 0)] = n.get(e.attr("core", 0), 0) + 1
    return n


@pytest.mark.parametrize("qlens, n_q", [([2, 1], 1), ([130, 1, 3], 2), ([300, 90], 4)])
def test_each_core_runs_its_heads_and_its_half_of_the_last_heads_q_tiles(batch_factory, qlens,
                                                                         n_q):
    # current API, Hkv = 3, G = 2 (unpacked: one output tile per query head and Q tile): core 0
    # runs head 0 and core 1 head 1, and each its half of head 2's n_q query tiles (an odd n_q's
    # middle tile on both, which store the same values)
    b = batch_factory(62, qlens, [300, 90, 40][:len(qlens)], H=6, Hkv=3, d=16, block_size=16)
    one = _stores(_run(b, "nki", 1, gqa_packing=False)[1])
    two = _stores(_run(b, "nki", 2, gqa_packing=False)[1])
    assert one == {0: 3 * 2 * n_q}
    per_core = 2 * n_q + 2 * -(-n_q // 2)
    assert two == {0: per_core, 1: per_core}
    # legacy API (grid [nl.nc(2), Hkv]): every head split by query tiles
    out1, _ = _run(b, "legacy", 1, gqa_packing=False)
    out2, t2 = _run(b, "legacy", 2, gqa_packing=False)
    assert _stores(t2) == {0: 3 * 2 * -(-n_q // 2), 1: 3 * 2 * -(-n_q // 2)}
    # a split head's earlier tiles run the later core's wider windows (their extra keys masked:
    # exact zeros), so its sums may round differently than at LNC 1, within float32 rounding
    np.testing.assert_allclose(out2, out1, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("api, hkv", [("nki", 2), ("nki", 3), ("legacy", 2), ("legacy", 3)])
def test_garbage_where_no_query_looks_never_reaches_the_output_on_two_cores(
        batch_factory, poison_unseen, api, hkv):
    b = batch_factory(63, QLENS, CLENS, H=2 * hkv, Hkv=hkv, d=32, block_size=16, dtype=BF16)
    clean, _ = _run(b, api, 2)
    dirty, _ = _run(b, api, 2, kv_cache=poison_unseen(b))
    assert np.isfinite(clean.astype(np.float32)).all()
    np.testing.assert_array_equal(dirty, clean)


@pytest.mark.parametrize("api", ["nki", "legacy"])
def test_two_core_launches_from_a_thread_pool_are_bit_identical(batch_factory, api):
    b = batch_factory(64, QLENS, CLENS, H=6, Hkv=3, d=16, block_size=16, dtype=BF16)
    want, _ = _run(b, api, 2)
    with ThreadPoolExecutor(max_workers=3) as pool:
        outs = [f.result(timeout=300) for f in
                [pool.submit(_run, b, api, 2) for _ in range(3)]]
    assert all(out.tobytes() == want.tobytes() for out, _ in outs)


def test_the_platform_lnc_is_the_default_of_both_entry_points(batch_factory, build_kernel_inputs,
                                                              monkeypatch):
    b = batch_factory(65, [2, 1], [300, 90], H=4, Hkv=2, d=16, block_size=16)
    _, inputs = build_kernel_inputs(b, large_tile_size=512)
    monkeypatch.delenv(toolchain.LNC_ENV, raising=False)

    def cores(api, **kw):
        with nki_sim.use_target("trn2"), nki_sim.tracing() as trace:
            out = flash_attn_varlen_nkifunc(*inputs, LARGE_TILE_SZ=512, backend="sim", api=api,
                                            **kw)
        return {e.attr("core", 0) for e in trace.events}, np.asarray(out)

    default, out2 = cores("nki")                        # trn2's LNC 2
    assert default == {0, 1}
    assert cores("legacy")[0] == {0, 1}                 # nl.nc places the programs
    monkeypatch.setenv(toolchain.LNC_ENV, "1")
    one, out1 = cores("nki")
    assert one == {0} and out1.tobytes() == out2.tobytes()
    assert cores("nki", lnc=2)[0] == {0, 1}           # the argument wins
    monkeypatch.delenv(toolchain.LNC_ENV)
    with nki_sim.use_target("trn1"), nki_sim.tracing() as trace:
        flash_attn_varlen_nkifunc(*inputs, LARGE_TILE_SZ=512, backend="sim")
    assert {e.attr("core", 0) for e in trace.events} == {0}    # trn1: one core


def test_two_cores_where_they_cannot_run_are_refused_before_any_work(batch_factory,
                                                                    build_kernel_inputs,
                                                                    monkeypatch):
    b = batch_factory(66, [2], [300], H=3, Hkv=3, d=16, block_size=16)
    _, inputs = build_kernel_inputs(b, large_tile_size=512)
    with nki_sim.use_target("trn2"), nki_sim.tracing() as trace:
        with pytest.raises(ValueError, match="lnc must be 1 or 2; got 3"):
            flash_attn_varlen_nkifunc(*inputs, LARGE_TILE_SZ=512, backend="sim", lnc=3)
        # a legacy front end that cannot place programs on cores (no nl.nc) splits nothing
        legacy_nl = toolchain.resolve_api("legacy").ops.nl
        monkeypatch.delattr(legacy_nl, "nc")
        for hkv in (3, 2):
            with pytest.raises(NotImplementedError, match=r"lnc=2: the 'legacy' API here cannot "
                                                          rf"split a launch over {hkv} KV head\(s\) "
                                                          r"between two cores \(nl\.nc is needed\)"):
                toolchain.resolve_api("legacy").lnc(2, hkv, odd_heads=True)
        with pytest.raises(NotImplementedError, match="cannot split a launch over 3 KV head"):
            flash_attn_varlen_nkifunc(*inputs, LARGE_TILE_SZ=512, backend="sim", api="legacy",
                                      lnc=2)
    assert not trace.events
    monkeypatch.undo()
    with nki_sim.use_target("trn1"):
        with pytest.raises(NotImplementedError, match="trn1 logical core is one NeuronCore"):
            paged_attention(*b.args(), kernel="dense", backend="sim", api="legacy", lnc=2)


def test_kv_heads_splits_an_even_count_and_refuses_an_odd_one():
    from nki_kernels.ops import current

    class _NL:          # nl.num_programs / nl.program_id of core `core` of a 2-core launch
        def __init__(self, core):
            self.core = core

        def num_programs(self, axes=0):
            return 2

        def program_id(self, axis=0):
            return self.core

    real = current.nl
    try:
        split = {}
        for core in (0, 1):
            current.nl = _NL(core)
            split[core] = list(current.kv_heads(4))
            assert list(current.kv_heads(0)) == []           # Hkv = 1: no head split by head
        assert split == {0: [0, 1], 1: [2, 3]}                                       # must-pass
        with pytest.raises(NotImplementedError, match="Hkv = 3 is not a multiple of 2"):
            current.kv_heads(3)                                                     # must-fail
    finally:
        current.nl = real
