"""host.plan_paged_attention / host.run_paged_attention: one validated, frozen plan per step,
per-layer runs bit-identical to the one-shot call, mismatches named, plans shared by threads;
host.scheduled.scheduled_index gathers equal to the NumPy builders they replace on devices."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest

import host
import nki_sim
from host.scheduled.schedule import make_schedule
from host.scheduled.scheduled import build_overlay, pack_queries, unpack_output
from host.scheduled.scheduled_index import output_index, overlay_index, query_index

H, HKV, D, B, N = 4, 2, 16, 8, 12
QLENS, CLENS = [3, 1, 1], [10, 0, 17]


def _batch(seed=0, H=H, Hkv=HKV):
    rng = np.random.default_rng(seed)
    T = sum(QLENS)
    bt = np.full((3, 4), -1, np.int32)
    perm = rng.permutation(N)
    used = 0
    for i, c in enumerate(CLENS):
        n = -(-c // B)
        bt[i, :n] = perm[used:used + n]
        used += n
    u = lambda *s: rng.uniform(-1, 1, s).astype(np.float32)  # noqa: E731
    return u(T, H, D), u(T, Hkv, D), u(T, Hkv, D), u(2, N, Hkv, B, D), bt


def _plan(bt, **kw):
    opts = dict(num_heads=H, num_kv_heads=HKV, head_size=D, block_size=B, num_blocks=N,
                dtype="float32", large_tile_size=512, backend="sim")
    opts.update(kw)
    return host.plan_paged_attention(bt, QLENS, CLENS, **opts)


def test_plan_is_frozen_and_read_only():
    *_, bt = _batch()
    plan = _plan(bt)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.num_heads = 8
    arrays = [plan.query_lens, plan.context_lens, plan.block_tables]
    for part in plan.parts:
        launch = part.launch
        arrays += [launch.q_init, launch.cls.partial.meta_i, launch.cls.full.meta_f]
    for a in arrays:
        assert not a.flags.writeable
    dense = _plan(bt, kernel="dense")
    assert not dense.dense.mask.flags.writeable and not dense.dense.active_table.flags.writeable
    for part in plan.parts:
        assert part.kernel_kwargs["options"].PARTIAL_TILE_SZ == part.schedule.partial_tile_size
        assert part.kernel_kwargs["options"].LARGE_TILE_SZ == part.schedule.large_tile_size
        with pytest.raises(TypeError):
            part.kernel_kwargs["alibi"] = True              # a read-only mapping


def test_the_window_flag_has_one_kernel_side_name():
    # the host's sliding_window (int or None) becomes ONE kernel flag, ``windowed``, from the
    # launch options down to the online-softmax steps
    from nki_kernels.scheduled.sched_config import SchedOptions
    from nki_kernels.scheduled.sched_core import StepConfig

    *_, bt = _batch()
    for window, want in ((None, False), (4, True)):
        plan = _plan(bt, sliding_window=window)
        assert [part.kernel_kwargs["options"].windowed for part in plan.parts] == \
            [want] * len(plan.parts)
    for cls in (SchedOptions, StepConfig):
        names = {f.name for f in dataclasses.fields(cls)}
        assert "windowed" in names and not names & {"one_sided", "window", "sliding_window"}


@pytest.mark.simulation
@pytest.mark.parametrize("kernel", ["scheduled", "dense"])
def test_runs_of_one_plan_equal_the_one_shot_call_bit_for_bit(kernel):
    *_, bt = _batch()
    plan = _plan(bt, kernel=kernel, mixed_precision=False)
    for layer in range(2):                                  # two "layers", one plan
        q, k, v, cache, _ = _batch(seed=10 + layer)
        got = host.run_paged_attention(plan, q, k, v, cache)
        want = host.paged_attention(q, k, v, cache, bt, QLENS, CLENS, kernel=kernel,
                                    mixed_precision=False, large_tile_size=512, backend="sim")
        assert got.tobytes() == want.tobytes()


@pytest.mark.simulation
def test_per_layer_sinks_override_the_plan_values(tol):
    q, k, v, cache, bt = _batch(3)
    plan = _plan(bt, sinks=np.zeros(H, np.float32), mixed_precision=False)
    sinks = np.linspace(-1, 2, H).astype(np.float32)
    got = host.run_paged_attention(plan, q, k, v, cache, sinks=sinks)
    ref = host.paged_attention_ref(q, k, v, cache, bt, QLENS, CLENS, sinks=sinks)
    np.testing.assert_allclose(got, ref, atol=tol("fp32", np.float32)[0])
    with pytest.raises(ValueError, match=r"alibi_slopes must be None: the plan was built without"):
        host.run_paged_attention(plan, q, k, v, cache, alibi_slopes=np.ones(H, np.float32))
    with pytest.raises(ValueError, match=r"sinks must have shape \(num_heads,\) = \(4,\)"):
        host.run_paged_attention(plan, q, k, v, cache, sinks=np.ones(3, np.float32))


@pytest.mark.parametrize("arg, change, match", [
    ("query", lambda a: a.update(query=a["query"][:, :2]), r"^query must have shape \(5, 4, 16\)"),
    ("key", lambda a: a.update(key=a["key"][:4]), r"^key must have shape \(5, 2, 16\)"),
    ("value", lambda a: a.update(value=a["value"].astype(np.float16)),
     r"^value.dtype must be the plan's float32; got float16"),
    ("kv_cache", lambda a: a.update(kv_cache=a["kv_cache"][:, :11]),
     r"^kv_cache must have shape \(2, 12, 2, 8, 16\)"),
])
def test_a_layer_that_does_not_fit_the_plan_is_named(arg, change, match):
    q, k, v, cache, bt = _batch()
    plan = _plan(bt)
    a = dict(query=q, key=k, value=v, kv_cache=cache)
    change(a)
    with pytest.raises(ValueError, match=match):
        host.run_paged_attention(plan, **a)


@pytest.mark.parametrize("kw, match", [
    (dict(num_blocks=0), r"^num_blocks must be >= 1"),
    (dict(dtype="float64"), r"^dtype must be one of"),
    (dict(kv_cache_dtype="float16"), r"^kv_cache_dtype must equal dtype \(float32\)"),
    (dict(block_size=12), r"^block_size must be a power of two"),
    (dict(num_blocks=5), r"^block_tables must hold block ids < num_blocks=5"),
    (dict(kernel="sparse"), r"^kernel must be one of"),
])
def test_plan_validation_names_the_argument(kw, match):
    *_, bt = _batch()
    with pytest.raises(ValueError, match=match):
        _plan(bt, **kw)
    with pytest.raises(TypeError, match="unexpected keyword arguments \\['windowsize'\\]"):
        _plan(bt, windowsize=3)


def test_paged_attention_plans_once(monkeypatch):
    import host.step_plan as sp

    calls = []
    real = sp.build_schedule
    monkeypatch.setattr(sp, "build_schedule", lambda *a, **k: calls.append(1) or real(*a, **k))
    q, k, v, cache, bt = _batch()
    monkeypatch.setattr("host.attention.launch_kernel",
                        lambda kern, args, kw, **_: np.zeros((args[1].shape[0], D), np.float32))
    host.paged_attention(q, k, v, cache, bt, QLENS, CLENS, large_tile_size=512, backend="sim")
    assert len(calls) == 1


@pytest.mark.simulation
def test_threads_share_one_plan():
    *_, bt = _batch()
    plan = _plan(bt, mixed_precision=False)
    layers = [_batch(seed=20 + i)[:4] for i in range(4)]
    want = [host.run_paged_attention(plan, *t) for t in layers]
    got = [None] * 4

    def work(i):
        got[i] = host.run_paged_attention(plan, *layers[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(g.tobytes() == w.tobytes() for g, w in zip(got, want))


@pytest.mark.parametrize("LT, LTp", [(512, None), (2048, 512)])
def test_device_gathers_equal_the_numpy_builders(LT, LTp):
    q, k, v, cache, bt = _batch(5)
    T = q.shape[0]
    s = make_schedule(QLENS, CLENS, bt, num_heads=H, num_kv_heads=HKV, head_size=D,
                      block_size=B, num_blocks=N, large_tile_size=LT, partial_tile_size=LTp)
    src = np.concatenate([cache.reshape(2, -1, D), np.stack([k, v]).reshape(2, T * HKV, D),
                          np.zeros((2, 1, D), np.float32)], axis=1)
    ov = overlay_index(s, bt, num_blocks=N, num_tokens=T)
    got = src[:, ov.reshape(-1)].reshape(2, ov.shape[0], -1)
    assert got.tobytes() == build_overlay(s, cache, k, v, bt).tobytes()
    qflat = np.concatenate([q.reshape(T * H, D), np.zeros((1, D), np.float32)])
    for cls in s.classes:
        qi = query_index(cls, H, HKV, T)
        qt = qflat[qi.reshape(-1)].reshape(HKV, cls.num_blocks, cls.rows, D)
        qt = qt.transpose(0, 1, 3, 2).reshape(HKV * cls.num_blocks * D, cls.rows)
        assert qt.tobytes() == pack_queries(cls, q, HKV).tobytes()
        out = np.random.default_rng(1).uniform(-1, 1, (HKV * cls.num_blocks * cls.rows, D))
        out = out.astype(np.float32)
        want = np.zeros((T, H, D), np.float32)
        unpack_output(cls, out, want)
        rows, dst = output_index(cls, H, HKV)
        got_out = np.zeros((T * H, D), np.float32)
        got_out[dst] = out[rows]
        # rows of other classes are zero in both
        assert got_out.reshape(T, H, D).tobytes() == want.tobytes()


def test_api_option_is_validated_once_and_named():
    *_, bt = _batch()
    with pytest.raises(ValueError, match=r"^api must be one of \('auto', 'legacy', 'nki'\); "
                                         r"got 'cuda'"):
        _plan(bt, api="cuda")
    # both kernels run on both APIs and on two physical cores (the dense kernel on the legacy
    # API over an even Hkv only; trn1 has one core per logical core)
    assert _plan(bt, kernel="dense", api="nki").api == "nki"
    assert _plan(bt, kernel="dense", api="nki", lnc=2).lnc == 2
    with nki_sim.use_target("trn1"):
        with pytest.raises(NotImplementedError, match="trn1 logical core is one NeuronCore"):
            _plan(bt, kernel="dense", api="legacy", lnc=2)
    assert _plan(bt, api="legacy").api == "legacy" and _plan(bt, api="auto").api is None
    plan = _plan(bt)
    q, k, v, cache, _ = _batch()
    with pytest.raises(ValueError, match=r"^api must be one of"):
        host.run_paged_attention(plan, q, k, v, cache, api=1)


@pytest.mark.simulation
def test_run_on_the_current_api_matches_the_legacy_run_bit_for_bit():
    import nki_sim
    from nki_kernels import toolchain

    if not toolchain.simulator_has_current():
        pytest.skip("this nki_sim has no current front end")
    q, k, v, cache, bt = _batch(7)
    plan = _plan(bt, mixed_precision=False)
    with nki_sim.use_target("trn2"):
        legacy = host.run_paged_attention(plan, q, k, v, cache, api="legacy")
        current = host.run_paged_attention(plan, q, k, v, cache, api="nki")
    ref = host.paged_attention_ref(q, k, v, cache, bt, QLENS, CLENS)
    np.testing.assert_allclose(current, ref, atol=1e-3)
    np.testing.assert_allclose(current, legacy, atol=1e-5)


@pytest.mark.simulation
def test_mla_plan_runs_every_layer_bit_identical_to_the_one_shot_call():
    rng = np.random.default_rng(4)
    N, Bm, E, Hm, R, P = 12, 16, 96, 8, 48, 16
    bt = np.array([[3, 5, 1], [7, -1, -1], [2, 9, -1]])
    ql, cl = [3, 1, 2], [40, 9, 30]
    plan = host.plan_mla_attention(bt, ql, cl, num_heads=Hm, num_blocks=N, block_size=Bm,
                                   entry_size=E, dtype="float32", kv_lora_rank=R,
                                   qk_rope_head_dim=P, large_tile_size=512, backend="sim")
    for _ in range(2):
        q = rng.uniform(-1, 1, (6, Hm, R + P)).astype(np.float32)
        cache = rng.uniform(-1, 1, (N, Bm, E)).astype(np.float32)
        got = host.run_mla_attention(plan, q, cache)
        want = host.mla_paged_attention(q, cache, bt, ql, cl, kv_lora_rank=R, qk_rope_head_dim=P,
                                        large_tile_size=512, backend="sim")
        assert got.tobytes() == want.tobytes()
    with pytest.raises(ValueError, match=r"^kv_cache must have shape \(12, 16, 96\) of the plan"):
        host.run_mla_attention(plan, q, cache[:, :, :80])
    with pytest.raises(ValueError, match=r"^entry_size must be >= 64"):
        host.plan_mla_attention(bt, ql, cl, num_heads=Hm, num_blocks=N, block_size=Bm,
                                entry_size=60, dtype="float32", kv_lora_rank=R, qk_rope_head_dim=P)
    with pytest.raises(ValueError, match=r"^num_heads must be <= 128"):
        host.plan_mla_attention(bt, ql, cl, num_heads=129, num_blocks=N, block_size=Bm,
                                entry_size=E, dtype="float32", kv_lora_rank=R, qk_rope_head_dim=P)
