"""torch tensors as legacy kernel arguments.

Legacy ``nki.jit`` (mode ``"auto"``) detects the framework from the arguments and runs the
kernel as a custom op of that framework: called with torch tensors (vLLM's
``flash_attn_varlen_nkifunc`` calls ``flash_paged_attention[1, n_kv_head](**kwargs)`` with torch
tensors), it takes torch tensors and returns torch tensors.  The simulator does the same with
CPU torch tensors: inputs by keyword or position, bf16 included, outputs as torch tensors,
``nt.mutable_tensor`` arguments written back into the caller's tensor.
"""

from __future__ import annotations

import numpy as np
import pytest

import neuronxcc.nki as nki
import neuronxcc.nki.language as nl
import neuronxcc.nki.typing as nt

pytestmark = pytest.mark.simulation
torch = pytest.importorskip("torch")


@nki.jit
def scaled_rows_k(x, w, scale=1.0):
    """out[h] = x[h] * w[h] * scale for program h of a [1, H] grid; x, w (H, 128, F)."""
    h = nl.program_id(axis=1)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    a = nl.load(x[h])
    b = nl.load(w[h])
    nl.store(out[h], value=nl.multiply(nl.multiply(a, b), scale, dtype=x.dtype))
    return out


@nki.jit
def add_into_k(cache: nt.mutable_tensor, v):
    """cache[0:128] += v (128, F); returns cache."""
    c = nl.load(cache[0:128, :])
    nl.store(cache[0:128, :], value=nl.add(c, nl.load(v)))
    return cache


def test_torch_keyword_arguments_on_a_grid_give_torch_outputs():
    g = torch.Generator().manual_seed(0)
    x = torch.rand((2, 128, 64), generator=g) - 0.5
    w = torch.rand((2, 128, 64), generator=g) - 0.5
    out = scaled_rows_k[1, 2](x=x, w=w, scale=0.25)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32 and out.shape == x.shape
    ref = x.numpy().astype(np.float64) * w.numpy().astype(np.float64) * 0.25
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-6, atol=1e-7)


def test_torch_bf16_and_non_contiguous_inputs():
    g = torch.Generator().manual_seed(1)
    x = (torch.rand((2, 64, 128), generator=g) - 0.5).to(torch.bfloat16).transpose(1, 2)
    w = torch.full((2, 128, 64), 2.0, dtype=torch.bfloat16)
    assert not x.is_contiguous()
    out = nki.simulate_kernel(scaled_rows_k[1, 2], x, w)
    assert out.dtype == torch.bfloat16
    ref = x.float().numpy().astype(np.float64) * 2.0        # * 2 is exact in bf16
    np.testing.assert_array_equal(out.float().numpy(), ref)


def test_mutable_torch_argument_is_written_back_and_returned():
    cache = torch.zeros((256, 32), dtype=torch.float32)
    v = torch.arange(128 * 32, dtype=torch.float32).reshape(128, 32)
    r = add_into_k(cache, v)
    assert r is cache
    ref = np.zeros((256, 32))
    ref[:128] = np.arange(128 * 32).reshape(128, 32)
    np.testing.assert_array_equal(cache.numpy(), ref)


def test_mutable_non_contiguous_torch_argument_is_written_back():
    base = torch.zeros((32, 256), dtype=torch.float32)
    cache = base.t()                                     # (256, 32), a non-contiguous view
    v = torch.ones((128, 32), dtype=torch.float32)
    add_into_k(cache, v)
    assert float(base[:, :128].sum()) == 128 * 32 and float(base[:, 128:].abs().sum()) == 0


def test_torch_tensor_off_cpu_is_rejected(rejects):
    x = torch.empty((1, 128, 8), device="meta")
    with rejects(ValueError, match="torch tensor on meta"):
        scaled_rows_k[1, 1](x, x)


def test_torch_float64_is_rejected_naming_the_argument(rejects):
    x = torch.zeros((1, 128, 8), dtype=torch.float64)
    with rejects(ValueError, match="'x' must have an NKI dtype.*float64"):
        scaled_rows_k[1, 1](x, x)
