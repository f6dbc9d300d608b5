"""``neuronxcc.nki.typing``: parameter annotations (``nt.tensor[...]``, ``nt.mutable_tensor``, ``scalar``)."""

from __future__ import annotations

from ..errors import not_emulated
from ..tensor import Tensor


class _Subscriptable(type):
    def __getitem__(cls, item):
        return cls


class tensor(metaclass=_Subscriptable):
    """``nt.tensor[shape, dtype]`` annotation (documentation only in the simulator)."""


class mutable_tensor(tensor):
    """Annotates a kernel parameter the kernel may write (it must also be returned)."""

    _nki_mutable = True


def scalar(x):
    """On-device scalar (used for runtime trip counts); not emulated beyond identity on ints."""
    if isinstance(x, Tensor):
        raise not_emulated("nt.scalar(<tile>) (runtime trip counts)")
    return x
