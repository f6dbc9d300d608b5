"""The scheduled kernel on both physical cores of a trn2 logical core (LNC=2): the KV heads split
between the cores, outputs bit-identical to LNC=1 and within tolerance of the float64 reference,
garbage in unseen cache slots never reaching the output, calls from worker threads (these two
also with one KV head, whose schedule is cut in item parts: test_scheduled_lnc_items.py), the
modeled launch time being the slower core's, and how the LNC is chosen (``Api.lnc``)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import nki_sim
from host.attention import paged_attention
from host.reference import paged_attention_ref
from nki_kernels import toolchain

pytestmark = [pytest.mark.simulation,
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]
QLENS, CLENS = [1, 3, 150, 1], [700, 40, 300, 1500]


def _run(b, lnc, kv_cache=None):
    return paged_attention(b.query, b.key, b.value, b.kv_cache if kv_cache is None else kv_cache,
                           b.block_tables, b.query_lens, b.context_lens, backend="sim",
                           large_tile_size=512, lnc=lnc)


def test_two_cores_match_one_core_and_the_reference(on_api, batch_factory, tol):
    b = batch_factory(31, QLENS, CLENS, H=8, Hkv=4, d=64, block_size=16)
    traces = {}
    with on_api("nki"):
        for lnc in (1, 2):
            with nki_sim.tracing() as traces[lnc]:
                out = _run(b, lnc)
            if lnc == 1:
                one = out
    assert out.tobytes() == one.tobytes()
    atol, rtol = tol("mixed", b.query.dtype)
    ref = paged_attention_ref(*b.args())
    assert np.all(np.abs(out.astype(np.float64) - ref) <= atol + rtol * np.abs(ref))
    from nki_sim import cost

    cores = {lnc: {e.attr("core", 0) for e in traces[lnc].events} for lnc in (1, 2)}
    assert cores == {1: {0}, 2: {0, 1}}
    rep1, rep2 = (cost.estimate_cores(traces[n], "trn2") for n in (1, 2))
    per = [r.modeled_us for r in rep2.per_core.values()]
    # each core moves half of the KV bytes: the heads are balanced by construction
    hbm = [r.hbm_bytes for r in rep2.per_core.values()]
    assert abs(hbm[0] - hbm[1]) <= 0.01 * max(hbm)
    assert rep2.launch_us == pytest.approx(max(per))
    assert rep2.launch_us < 0.55 * rep1.launch_us


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])     # bf16: K^T by DMA transposes
@pytest.mark.parametrize("api, hkv", [("nki", 2), ("nki", 1), ("legacy", 1)])  # 1: item parts
def test_garbage_where_no_query_looks_never_reaches_the_output_on_two_cores(on_api,
                                                                           batch_factory, dtype,
                                                                           api, hkv):
    import ml_dtypes

    q, c, B = [1, 3, 40, 1, 1], [50, 7, 300, 33, 90], 16
    dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32
    b = batch_factory(32, q, c, H=2 * hkv, Hkv=hkv, d=16, block_size=B, spare_blocks=3, dtype=dt)
    # NaN in every cache slot no query may see: each context's last block past its end, and
    # every block no table lists
    dirty = np.full_like(b.kv_cache, np.nan)
    for i, ci in enumerate(c):
        n = -(-ci // B)
        seen = b.block_tables[i, :n]
        dirty[:, seen[:-1]] = b.kv_cache[:, seen[:-1]]
        dirty[:, seen[-1], :, :ci - (n - 1) * B] = b.kv_cache[:, seen[-1], :, :ci - (n - 1) * B]
    with on_api(api):
        clean, out = _run(b, 2), _run(b, 2, kv_cache=dirty)
    assert out.tobytes() == clean.tobytes() and np.isfinite(out).all()


@pytest.mark.parametrize("hkv", [2, 1])          # 1: the schedule in item parts
def test_two_core_launches_from_a_thread_pool_are_bit_identical(on_api, batch_factory, hkv):
    batches = [batch_factory(40 + i, [1, 2 + i, 1], [90 + 40 * i, 20, 300], H=2 * hkv, Hkv=hkv,
                             d=16, block_size=16) for i in range(3)]
    with on_api("nki"):
        serial = [_run(b, 2) for b in batches]
        with ThreadPoolExecutor(max_workers=3) as pool:
            threaded = list(pool.map(lambda b: _run(b, 2), batches))
    assert all(s.tobytes() == t.tobytes() for s, t in zip(serial, threaded))


def _api(name, target):
    return toolchain.Api(name, True, target)


def test_the_platform_default_and_the_environment_choose_the_lnc(monkeypatch):
    monkeypatch.delenv(toolchain.LNC_ENV, raising=False)
    assert _api("nki", "trn2").lnc(None, 8) == 2          # trn2's default LNC=2
    assert _api("legacy", "trn1").lnc(None, 8) == 1
    assert _api("nki", "trn2").lnc(None, 3) == 1          # an odd Hkv cannot be split
    assert _api("legacy", "trn2").lnc(None, 8) == 2       # nl.nc places programs on cores
    assert _api("nki", "trn2").lnc(1, 8) == 1
    monkeypatch.setenv(toolchain.LNC_ENV, "1")
    assert _api("nki", "trn2").lnc(None, 8) == 1
    assert _api("nki", "trn2").lnc(2, 8) == 2             # the argument wins
    monkeypatch.setenv(toolchain.LNC_ENV, "4")
    with pytest.raises(ValueError, match="NEURON_LOGICAL_NC_CONFIG must be 1 or 2; got '4'"):
        _api("nki", "trn2").lnc(None, 8)


@pytest.mark.parametrize("name, target, hkv, match", [
    ("legacy", "trn1", 8, "trn1 logical core is one NeuronCore"),
    ("nki", "trn2", 3, "cannot split a launch over 3 KV head"),
])
def test_two_cores_where_they_cannot_run_is_refused(monkeypatch, name, target, hkv, match):
    monkeypatch.delenv(toolchain.LNC_ENV, raising=False)
    with pytest.raises(NotImplementedError, match=match):
        _api(name, target).lnc(2, hkv)
    with pytest.raises(ValueError, match="lnc must be 1 or 2; got 3"):
        _api(name, target).lnc(3, hkv)


def test_legacy_two_cores_place_the_programs_on_both_cores(on_api, batch_factory, tol):
    # grid [1, nl.spmd_dim(nl.nc(2), Hkv/2)]: KV heads 0..Hkv/2-1 on core 0, the rest on core 1
    b = batch_factory(33, QLENS, CLENS, H=8, Hkv=4, d=32, block_size=16)
    with on_api("legacy"):
        one = _run(b, 1)
        with nki_sim.tracing() as trace:
            two = _run(b, 2)
    assert two.tobytes() == one.tobytes()
    heads = {}
    for e in trace.events:
        heads.setdefault(e.attr("core", 0), set()).add(e.program_id[1])
    assert heads == {0: {0, 1}, 1: {2, 3}}
