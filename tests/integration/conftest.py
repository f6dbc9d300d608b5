"""Fixtures of the torch integration tests (torch is an optional extra: imported lazily)."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def simulated_device(monkeypatch):
    """Pretend the toolchain is present and run each launch of the torch XLA device path
    (``host.serving.torch_neuron``) on the simulator (NumPy views of the CPU tensors); returns
    the list of (kernel, grid) launches."""
    torch = pytest.importorskip("torch")
    from host.serving import torch_neuron
    from nki_kernels import toolchain
    from nki_kernels.ops import KernelFamily

    calls = []

    def launch(kernel, grid, *a, api=None, lnc=None, item_parts=1, **kw):
        calls.append((kernel, grid))
        np_args = [x.numpy() if isinstance(x, torch.Tensor) else x for x in a]
        kw = {k: x.numpy() if isinstance(x, torch.Tensor) else x for k, x in kw.items()}
        if isinstance(kernel, KernelFamily):          # the API choice of the real path
            out = toolchain.resolve_api(api).launch(kernel, np_args, kw,
                                                    num_kv_heads=None if grid is None else grid[1],
                                                    device=False, lnc=lnc, item_parts=item_parts)
        else:
            out = toolchain.nki.simulate_kernel(kernel[grid] if grid else kernel, *np_args, **kw)
        if isinstance(out, tuple):                     # a kernel with several outputs
            return tuple(torch.from_numpy(np.ascontiguousarray(x)) for x in out)
        return torch.from_numpy(np.ascontiguousarray(out))

    monkeypatch.setattr(torch_neuron, "toolchain_status",
                        lambda api=None: (True, "simulated for a test"))
    monkeypatch.setattr(torch_neuron, "launch", launch)
    return calls
