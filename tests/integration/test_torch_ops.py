"""torch custom ops nki_pa::{paged_attention, reshape_and_cache, copy_blocks}: numerics against the
float64 reference and hand-indexed cache contents, torch.library.opcheck, a torch.compile'd call,
and the XLA device path (selection with and without the toolchain; its torch-side input
preparation run with the kernel launch routed to the simulator)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import host.serving.torch_ops as ops  # noqa: E402
from host import paged_attention_ref  # noqa: E402
from host.serving import torch_neuron  # noqa: E402
from nki_kernels import toolchain  # noqa: E402

pytestmark = pytest.mark.simulation

H, HKV, D, B, N = 4, 2, 16, 8, 12


def make_batch(seed, query_lens=(3, 1, 1), context_lens=(10, 0, 17), dtype=torch.float32):
    """Random flat batch: U[-1, 1] values, scattered cache blocks, -1 padded block tables."""
    g = torch.Generator().manual_seed(seed)
    T = sum(query_lens)

    def u(*shape):
        return (torch.rand(shape, generator=g) * 2 - 1).to(dtype)

    perm = torch.randperm(N, generator=g).tolist()
    bt = torch.full((len(query_lens), 4), -1, dtype=torch.int32)
    used = 0
    for i, c in enumerate(context_lens):
        n = -(-c // B)
        bt[i, :n] = torch.tensor(perm[used:used + n], dtype=torch.int32)
        used += n
    return dict(query=u(T, H, D), key=u(T, HKV, D), value=u(T, HKV, D),
                kv_cache=u(2, N, HKV, B, D), block_tables=bt,
                query_lens=torch.tensor(query_lens), context_lens=torch.tensor(context_lens))


def reference(b, **kw):
    f = {k: (v.float().numpy() if v.is_floating_point() else v.numpy()) for k, v in b.items()}
    return paged_attention_ref(f["query"], f["key"], f["value"], f["kv_cache"], f["block_tables"],
                               f["query_lens"], f["context_lens"], **kw)


def args(b):
    return (b["query"], b["key"], b["value"], b["kv_cache"], b["block_tables"], b["query_lens"],
            b["context_lens"])


@pytest.mark.parametrize("dtype, mixed, mode", [(torch.float32, False, "fp32"),
                                                (torch.bfloat16, True, "mixed")])
def test_paged_attention_op_matches_reference(dtype, mixed, mode, tol):
    b = make_batch(1, dtype=dtype)
    out = torch.ops.nki_pa.paged_attention(*args(b), mixed_precision=mixed, large_tile_size=512)
    assert out.dtype == dtype and out.shape == b["query"].shape
    atol, rtol = tol(mode, "bfloat16" if dtype == torch.bfloat16 else "float32")
    np.testing.assert_allclose(out.float().numpy(), reference(b), atol=atol, rtol=rtol)


@pytest.mark.parametrize("attention_kernel, gqa_packing", [(None, None), ("scheduled", None),
                                                          ("dense", True), ("dense", False)])
def test_paged_attention_op_passes_kernel_scale_and_packing(attention_kernel, gqa_packing, tol):
    b = make_batch(2, query_lens=(1, 1), context_lens=(20, 9))
    out = torch.ops.nki_pa.paged_attention(*args(b), softmax_scale=0.3, mixed_precision=False,
                                           large_tile_size=512, gqa_packing=gqa_packing,
                                           attention_kernel=attention_kernel)
    np.testing.assert_allclose(out.numpy(), reference(b, softmax_scale=0.3),
                               atol=tol("fp32", "float32")[0])


def test_paged_attention_op_selects_the_kernel(monkeypatch):
    """attention_kernel reaches the step's plan as kernel= (None: the host default)."""
    import functools

    seen = []
    real = ops.step_plan

    @functools.wraps(real)
    def spy(*a, **kw):
        seen.append(kw.get("kernel"))
        plan = real(*a, **kw)
        seen.append(plan.kernel)
        return plan

    monkeypatch.setattr(ops, "step_plan", spy)
    b = make_batch(11)
    torch.ops.nki_pa.paged_attention(*args(b), large_tile_size=512)
    torch.ops.nki_pa.paged_attention(*args(b), large_tile_size=512, attention_kernel="dense")
    assert seen == [None, "scheduled", "dense", "dense"]


def test_layers_of_a_step_share_one_plan():
    """Four 'layers' with the same batch: one plan is built, three are reused; the per-layer
    sinks still reach each layer (a different sink changes the output)."""
    from host.plan_cache import clear_plan_cache, plan_cache_stats

    clear_plan_cache()
    b = make_batch(12)
    outs = [torch.ops.nki_pa.paged_attention(*args(b), large_tile_size=512,
                                             sinks=torch.full((H,), float(i)))
            for i in range(4)]
    assert plan_cache_stats() == {"built": 1, "reused": 3}
    assert not torch.equal(outs[0], outs[1])
    np.testing.assert_allclose(outs[3].numpy(), reference(b, sinks=np.full(H, 3.0, np.float32)),
                               atol=3e-2)


@pytest.mark.parametrize("option", ops.VARIANT_OPTIONS)
def test_variant_options_reach_the_host_function_or_raise(option, monkeypatch):
    import host.attention

    assert ops.host_options(**{option: None}) == {}
    assert ops.host_options(**{option: 3}) == {option: 3}      # the installed host takes them all

    def older_host(query, key, value, kv_cache, block_tables, query_lens, context_lens, *,
                   softmax_scale=None, mixed_precision=True, large_tile_size=2048):
        raise AssertionError("not called")

    monkeypatch.setattr(host.attention, "paged_attention", older_host)
    assert ops.host_options(**{option: None}) == {}
    with pytest.raises(NotImplementedError, match=f"does not support \\['{option}'\\]"):
        ops.host_options(**{option: 3})


def test_reshape_and_cache_op_writes_the_slots():
    b = make_batch(3)
    cache = b["kv_cache"].clone()
    slots = torch.tensor([5, 17, -1, 95, 40])
    torch.ops.nki_pa.reshape_and_cache(b["key"], b["value"], cache, slots)
    expected = b["kv_cache"].clone()
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            expected[0, s // B, :, s % B] = b["key"][t]
            expected[1, s // B, :, s % B] = b["value"][t]
    assert torch.equal(cache, expected)


@pytest.mark.parametrize("layers", [None, 3])
def test_copy_blocks_op_copies_every_layer(layers):
    g = torch.Generator().manual_seed(4)
    shape = (2, N, HKV, B, D) if layers is None else (layers, 2, N, HKV, B, D)
    caches = torch.rand(shape, generator=g)
    before = caches.clone()
    torch.ops.nki_pa.copy_blocks(caches, torch.tensor([[1, 7], [4, 0]]))
    expected = before.clone()
    expected[..., 7, :, :, :] = before[..., 1, :, :, :]
    expected[..., 0, :, :, :] = before[..., 4, :, :, :]
    assert torch.equal(caches, expected)


def test_fp8_cache_write_and_attention_through_the_ops(tol):
    """reshape_and_cache into a float8_e4m3fn cache with a per-KV-head k_scale and a per-tensor
    v_scale writes exactly what host.reshape_and_cache writes; paged_attention with the same
    scales matches the float64 reference on that cache."""
    from host import reshape_and_cache as host_write
    from host._arrays import to_numpy

    b = make_batch(12, query_lens=(3,), context_lens=(20,))
    g = torch.Generator().manual_seed(12)
    k_ctx, v_ctx = (torch.rand((20, HKV, D), generator=g) * 4 - 2 for _ in range(2))
    k_scale, v_scale = torch.tensor([0.02, 0.03]), torch.tensor(0.05)
    cache = torch.zeros((2, N, HKV, B, D), dtype=torch.float8_e4m3fn)
    slots = b["block_tables"][0, :3].long().repeat_interleave(B) * B + torch.arange(24) % B
    torch.ops.nki_pa.reshape_and_cache(k_ctx, v_ctx, cache, slots[:20], k_scale=k_scale,
                                       v_scale=v_scale)
    expected = torch.zeros_like(cache)
    host_write(k_ctx, v_ctx, expected, slots[:20], k_scale=k_scale, v_scale=v_scale)
    assert torch.equal(cache.view(torch.uint8), expected.view(torch.uint8))
    assert cache.view(torch.uint8).any()
    out = torch.ops.nki_pa.paged_attention(b["query"], b["key"], b["value"], cache,
                                           b["block_tables"], b["query_lens"], b["context_lens"],
                                           mixed_precision=False, large_tile_size=512,
                                           k_scale=k_scale, v_scale=v_scale)
    ref = paged_attention_ref(b["query"].numpy(), b["key"].numpy(), b["value"].numpy(),
                              to_numpy(cache, "kv_cache")[0], b["block_tables"].numpy(), [3], [20],
                              k_scale=k_scale.numpy(), v_scale=v_scale.numpy())
    np.testing.assert_allclose(out.numpy(), ref, atol=tol("fp32", "float32")[0])


def test_opcheck_all_ops():
    b = make_batch(5)
    torch.library.opcheck(torch.ops.nki_pa.paged_attention.default, args(b),
                          dict(mixed_precision=False, large_tile_size=512, softmax_scale=0.5))
    torch.library.opcheck(torch.ops.nki_pa.reshape_and_cache.default,
                          (b["key"], b["value"], b["kv_cache"].clone(), torch.tensor([0, 9, 3, -1, 60])))
    fp8 = torch.zeros((2, N, HKV, B, D), dtype=torch.float8_e5m2)
    torch.library.opcheck(torch.ops.nki_pa.reshape_and_cache.default,
                          (b["key"], b["value"], fp8, torch.tensor([0, 9, 3, -1, 60])),
                          dict(k_scale=torch.tensor(0.5), v_scale=torch.tensor([0.25, 2.0])),
                          test_utils=("test_faketensor",))   # torch has no fp8 arithmetic on CPU
    torch.library.opcheck(torch.ops.nki_pa.copy_blocks.default,
                          (torch.stack([b["kv_cache"]] * 2).clone(), torch.tensor([[2, 3], [5, 11]])))


def test_torch_compile_fullgraph_matches_eager():
    b = make_batch(6)
    slots = torch.tensor([80, 81, 82, 88, 89])

    def step(query, key, value, kv_cache, slot_mapping, block_tables, query_lens, context_lens):
        torch.ops.nki_pa.reshape_and_cache(key, value, kv_cache, slot_mapping)
        out = torch.ops.nki_pa.paged_attention(query * 0.5, key, value, kv_cache, block_tables,
                                               query_lens, context_lens, mixed_precision=False,
                                               large_tile_size=512)
        return out.sum(-1) + 1.0

    compiled = torch.compile(step, fullgraph=True)
    cache_c, cache_e = b["kv_cache"].clone(), b["kv_cache"].clone()
    rest = (b["block_tables"], b["query_lens"], b["context_lens"])
    got = compiled(b["query"], b["key"], b["value"], cache_c, slots, *rest)
    want = step(b["query"], b["key"], b["value"], cache_e, slots, *rest)
    assert torch.equal(cache_c, cache_e) and not torch.equal(cache_c, b["kv_cache"])
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------- XLA device path


def test_xla_kernels_are_registered():
    for name in ("paged_attention", "reshape_and_cache", "copy_blocks"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"nki_pa::{name}", "XLA")
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"nki_pa::{name}", "CPU")


def test_toolchain_selection(monkeypatch):
    present = set()
    monkeypatch.setattr(torch_neuron, "_find_spec", lambda m: object() if m in present else None)
    ok, why = torch_neuron.toolchain_status()
    assert not ok and "torch_neuronx, torch_xla not importable" in why
    present.add("torch_neuronx")
    assert torch_neuron.toolchain_status() == (False, "torch_xla not importable")
    present.add("torch_xla")
    chosen = {}

    def resolve(api=None):
        if "error" in chosen:
            raise RuntimeError(chosen["error"])
        return toolchain.Api(chosen["name"], chosen["simulated"], None)

    monkeypatch.setattr(toolchain, "resolve_api", resolve)
    chosen.update(name="nki", simulated=True)
    ok, why = torch_neuron.toolchain_status()
    assert not ok and "nki_sim" in why                                       # must-fail
    # SDK 2.34 on trn2: the real current nki, no neuronxcc.nki (nki_sim stands in for it)
    chosen.update(name="nki", simulated=False)
    assert torch_neuron.toolchain_status() == (
        True, "torch-neuronx, torch-xla and nki (api='nki') are importable")  # must-pass
    chosen.update(name="legacy", simulated=False)                            # SDK <= 2.28
    assert torch_neuron.toolchain_status()[0]
    chosen["error"] = "api='legacy' needs neuronx-cc with the neuronxcc.nki namespace"
    ok, why = torch_neuron.toolchain_status("legacy")
    assert not ok and "no NKI API to launch on" in why and "neuronxcc.nki namespace" in why


@pytest.mark.skipif(torch_neuron.toolchain_status()[0], reason="the Neuron toolchain is installed")
def test_device_path_refuses_without_the_toolchain():
    b = make_batch(7)
    for call in (lambda: torch_neuron._paged_attention_xla(*args(b)),
                 lambda: torch_neuron._reshape_and_cache_xla(b["key"], b["value"], b["kv_cache"],
                                                             torch.arange(5)),
                 lambda: torch_neuron._copy_blocks_xla(b["kv_cache"], torch.tensor([[0, 1]]))):
        with pytest.raises(NotImplementedError, match="needs the Neuron toolchain.*torch_neuronx"):
            call()


def test_device_path_numerics_with_a_simulated_launch(simulated_device, tol):
    from nki_kernels.cache.block_copy import copy_cache_blocks
    from nki_kernels.dense.flash_paged_attention import flash_paged_attention
    from nki_kernels.cache.kv_cache_update import kv_cache_update

    from nki_kernels.scheduled.scheduled_attention import scheduled_paged_attention

    b = make_batch(8)
    out = torch_neuron._paged_attention_xla(*args(b), mixed_precision=False, large_tile_size=512)
    np.testing.assert_allclose(out.numpy(), reference(b), atol=tol("fp32", "float32")[0])
    cpu = torch.ops.nki_pa.paged_attention(*args(b), mixed_precision=False, large_tile_size=512)
    assert torch.equal(out, cpu)                   # the same kernel and inputs as on the CPU
    win = torch_neuron._paged_attention_xla(*args(b), mixed_precision=False, large_tile_size=512,
                                            sliding_window=4, sinks=torch.linspace(-1, 1, H))
    np.testing.assert_allclose(win.numpy(), reference(b, sliding_window=4,
                                                      sinks=np.linspace(-1, 1, H, dtype=np.float32)),
                               atol=tol("fp32", "float32")[0])
    dense = torch_neuron._paged_attention_xla(*args(b), mixed_precision=False, large_tile_size=512,
                                              attention_kernel="dense")
    np.testing.assert_allclose(dense.numpy(), reference(b), atol=tol("fp32", "float32")[0])
    launches = len(simulated_device)

    cache = b["kv_cache"].clone()
    slots = torch.tensor([3, 50, -1, 91, 20])
    torch_neuron._reshape_and_cache_xla(b["key"], b["value"], cache, slots)
    expected = b["kv_cache"].clone()
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            expected[:, s // B, :, s % B] = torch.stack([b["key"][t], b["value"][t]])
    assert torch.equal(cache, expected)

    caches = torch.stack([b["kv_cache"], -b["kv_cache"]]).clone()
    torch_neuron._copy_blocks_xla(caches, torch.tensor([[2, 9]]))
    assert torch.equal(caches[:, :, 9], caches[:, :, 2]) and torch.equal(caches[:, :, 2],
                                                                       torch.stack([b["kv_cache"], -b["kv_cache"]])[:, :, 2])
    assert [k for k, _ in simulated_device[:launches]].count(flash_paged_attention) == 1
    assert {k for k, _ in simulated_device[:launches]} == {scheduled_paged_attention,
                                                           flash_paged_attention}
    assert all(g == (1, HKV) for _, g in simulated_device[:launches])
    # the cache kernels run on the API the attention launches use (not the legacy one always)
    assert simulated_device[launches:] == [(kv_cache_update, None), (copy_cache_blocks, None)]


@pytest.mark.parametrize("gqa_packing", [True, False, None])
def test_device_path_packs_gqa_heads_for_the_dense_kernel_as_the_cpu_does(simulated_device, tol,
                                                                          gqa_packing):
    from host import plan_paged_attention

    b = make_batch(11, query_lens=(6, 1, 3), context_lens=(10, 20, 17))
    opts = dict(mixed_precision=False, large_tile_size=512, attention_kernel="dense",
                gqa_packing=gqa_packing)
    out = torch_neuron._paged_attention_xla(*args(b), **opts)
    np.testing.assert_allclose(out.numpy(), reference(b), atol=tol("fp32", "float32")[0])
    cpu = torch.ops.nki_pa.paged_attention(*args(b), **opts)
    assert torch.equal(out, cpu)                   # the same plan, packing and kernel inputs
    plan = plan_paged_attention(b["block_tables"].numpy(), b["query_lens"].numpy(),
                                b["context_lens"].numpy(), num_heads=H, num_kv_heads=HKV,
                                head_size=D, block_size=B, num_blocks=N, dtype="float32",
                                kernel="dense", large_tile_size=512,
                                gqa_packing="auto" if gqa_packing is None else gqa_packing)
    assert plan.dense.gqa_packed == (gqa_packing is not False)     # packing ran where asked


def test_device_path_launches_the_dense_kernel_at_the_logical_cores_lnc(simulated_device,
                                                                       monkeypatch, tol):
    # neuronx-cc refuses a kernel configured for another LNC than its own (EVRF066, LNC 2 by
    # default on trn2): the dense launch leaves the LNC to the environment, as the scheduled one
    seen = []
    inner = torch_neuron.launch

    def spy(kernel, grid, *a, lnc=None, **kw):
        seen.append(lnc)
        return inner(kernel, grid, *a, lnc=lnc, **kw)

    monkeypatch.setattr(torch_neuron, "launch", spy)
    b = make_batch(8)
    out = torch_neuron._paged_attention_xla(*args(b), mixed_precision=False, large_tile_size=512,
                                            attention_kernel="dense")
    assert seen == [None]
    np.testing.assert_allclose(out.numpy(), reference(b), atol=tol("fp32", "float32")[0])


def test_device_path_runs_a_mixed_batch_as_one_pair_launch(simulated_device, tol):
    from nki_kernels.scheduled.scheduled_pair import scheduled_pair_attention

    # a 40-token prefill chunk (80 query rows per KV head) beside two decodes
    b = make_batch(9, query_lens=(40, 1, 1), context_lens=(10, 0, 17))
    out = torch_neuron._paged_attention_xla(*args(b), mixed_precision=False, large_tile_size=512)
    assert [k for k, _ in simulated_device] == [scheduled_pair_attention]
    np.testing.assert_allclose(out.numpy(), reference(b), atol=tol("fp32", "float32")[0])
    cpu = torch.ops.nki_pa.paged_attention(*args(b), mixed_precision=False, large_tile_size=512)
    assert torch.equal(out, cpu)


def test_device_path_rejects_what_it_cannot_run(simulated_device):
    b = make_batch(9)
    with pytest.raises(NotImplementedError, match=r"fp8 caches \(k_scale / v_scale\) need CPU"):
        torch_neuron._paged_attention_xla(*args(b), k_scale=torch.tensor(1.0),
                                          v_scale=torch.tensor(1.0))
    with pytest.raises(NotImplementedError, match=r"gqa_packing=False applies to kernel='dense'"):
        torch_neuron._paged_attention_xla(*args(b), gqa_packing=False)      # as on the CPU
    with pytest.raises(NotImplementedError, match=r"fp8 caches \(k_scale / v_scale\) need CPU"):
        torch_neuron._reshape_and_cache_xla(b["key"], b["value"], b["kv_cache"], torch.arange(5),
                                            k_scale=torch.tensor(1.0))
    with pytest.raises(ValueError, match="query_lens must sum to query.shape\\[0\\] = 5"):
        torch_neuron._paged_attention_xla(*args({**b, "query_lens": torch.tensor([1, 1, 1])}))
    assert simulated_device == []


def test_cpu_tensors_never_take_the_device_path(monkeypatch, tol):
    def refuse(*a, **kw):
        raise AssertionError("device path used for CPU tensors")

    monkeypatch.setattr(torch_neuron, "toolchain_status", lambda api=None: (True, "pretend"))
    monkeypatch.setattr(torch_neuron, "launch", refuse)
    b = make_batch(10)
    out = torch.ops.nki_pa.paged_attention(*args(b), mixed_precision=False, large_tile_size=512)
    np.testing.assert_allclose(out.numpy(), reference(b), atol=tol("fp32", "float32")[0])
