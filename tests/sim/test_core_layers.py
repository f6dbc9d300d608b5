"""The core tensor carries no front-end semantics; each front end's tensors keep their class
through views, and a launch makes every tensor of its kernel with the front end's class."""

from __future__ import annotations

import numpy as np
import pytest

from nki_sim.legacy import language as nl
from nki_sim.legacy import nki_api as nki
from nki_sim.legacy.tensor import LegacyTensor
from nki_sim.memory import Alloc
from nki_sim.tensor import Tensor

LEGACY_ONLY = ("__add__", "__mul__", "__eq__", "__setitem__", "__iadd__", "astype", "broadcast_to",
               "T", "fresh", "pmask", "producer")


def _core_view(shape=(4, 6)):
    a = Alloc(np.arange(np.prod(shape), dtype=np.float32).reshape(shape), "hbm", name="x", written=True)
    return Tensor(a, a.data)


def test_core_tensor_has_no_legacy_semantics():
    t = _core_view()
    for name in LEGACY_ONLY:
        assert not hasattr(Tensor, name) or getattr(Tensor, name) is getattr(object, name, None), name
        assert hasattr(LegacyTensor, name), name
    with pytest.raises(TypeError):
        t + t                                   # no operators on the core type
    with pytest.raises(TypeError):
        t[0:2, :] = 1.0                         # no assignment semantics either


def test_views_keep_the_class_of_their_parent():
    class FrontEndTensor(Tensor):
        __slots__ = ()
    a = Alloc(np.zeros((8, 6), np.float32), "hbm", name="y", written=True)
    for t, cls in ((_core_view((8, 6)), Tensor), (FrontEndTensor(a, a.data), FrontEndTensor)):
        views = (t[2:5, :], t[1], t[..., 0:3], t.reshape((6, 8)), t.expand_dims(0),
                 t[nl.arange(2)[:, None], nl.arange(3)[None, :]])
        assert all(type(v) is cls for v in views), [type(v).__name__ for v in views]
        np.testing.assert_array_equal(t[2:5, :].arr, t.arr[2:5, :])


@nki.jit
def classes_k(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    s = t + t
    for v in (x, x[0:2, :], out, t, t[:, 0:2], s, nl.zeros((4, 2), nl.float32)):
        assert type(v) is LegacyTensor, type(v).__name__
    nl.store(out, value=s)
    return out


def test_a_legacy_launch_makes_legacy_tensors(rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    np.testing.assert_array_equal(nki.simulate_kernel(classes_k, x), x + x)
