"""Every check of the current front end: a must-pass and a must-fail kernel body each.

Messages follow AWS's simulator where its text is known (``dma_copy dst partition dimension 256
exceeds maximum 128``, ``dst must be in ['psum'], got sbuf``, the element-count text, ...).
"""

from __future__ import annotations

import numpy as np
import pytest

import nki_sim
from nki_sim.current.checks import NkiValidationError
from nki_sim.errors import NotEmulatedError
from sim_nki_util import nisa, nki, nl, sb

X = np.zeros((128, 8), np.float32)
IDX = np.zeros((4, 1), np.int32)


def _idx():
    t = sb((4, 1), nl.int32)
    nisa.iota(dst=t, pattern=[[0, 1]], channel_multiplier=1)
    return t


def _acc_memset(first_memset):
    a = sb((128, 8), nl.bfloat16)
    nisa.memset(dst=a, value=1.0)
    ps = nl.ndarray((8, 8), nl.float32, buffer=nl.psum)
    if first_memset:
        nisa.memset(dst=ps, value=0.0)
    else:
        nisa.nc_matmul(dst=ps, stationary=a, moving=a)
    nisa.nc_matmul(dst=ps, stationary=a, moving=a, accumulate=True)


def _fori(mode):
    def body(i):
        t = sb((128, 8))
        nisa.dma_copy(dst=t, src=HBM[0], dge_mode=mode)
    nl.fori_loop(0, 2, body)


HBM = [None]


def _run(body):
    @nki.jit
    def k(x, idx):
        HBM[0] = x
        body(x, idx)
        o = nl.ndarray((1, 1), nl.float32, buffer=nl.shared_hbm)
        t = sb((1, 1))
        nisa.memset(dst=t, value=0.0)
        nisa.dma_copy(dst=o, src=t)
        return o
    return k(X, IDX)


CASES = {
    "partition limit": (lambda x, i: sb((128, 4)), lambda x, i: sb((256, 4)),
                        "partition dimension 256 exceeds maximum 128"),
    "on-chip rank": (lambda x, i: sb((128, 1)), lambda x, i: sb((128,)),
                     r"SBUF and PSUM tensors must have at least 2 dimensions \(partition-dim and free-dim\)"),
    # a tensor is live from its allocation to its last access (Python references do not count):
    # two big tiles one after the other fit, the first read after the second exists does not
    "sbuf capacity": (lambda x, i: [_filled((128, 50000)), _filled((128, 10000))],
                      lambda x, i: _overlapping((128, 50000), (128, 10000)),
                      r"SBUF capacity exceeded: with `\w+` allocated, the sbuf tensors still to be "
                      r"accessed take 240000 bytes per partition; trn2 has 212984"),
    "psum capacity": (lambda x, i: nl.ndarray((128, 4096), nl.float32, buffer=nl.psum),
                      lambda x, i: nl.ndarray((128, 4097), nl.float32, buffer=nl.psum), "PSUM has 16384"),
    "element count": (lambda x, i: nisa.dma_copy(dst=sb((128, 8)), src=x),
                      lambda x, i: nisa.dma_copy(dst=sb((128, 4)), src=x),
                      "dma_copy requires src and dst to have the same number of elements, got src=1024, dst=512"),
    "dma from psum": (lambda x, i: nisa.dma_copy(dst=sb((128, 8)), src=x),
                      lambda x, i: nisa.dma_copy(dst=sb((128, 8)), src=nl.ndarray((128, 8), nl.float32, buffer=nl.psum)),
                      r"dma_copy src must be in \['hbm', 'sbuf'\], got psum"),
    "matmul dst in psum": (lambda x, i: _acc_memset(False),
                           lambda x, i: nisa.nc_matmul(dst=sb((8, 8)), stationary=sb((128, 8)), moving=sb((128, 8))),
                           r"dst must be in \['psum'\], got sbuf"),
    "matmul dst fp32": (lambda x, i: _acc_memset(False),
                        lambda x, i: nisa.nc_matmul(dst=nl.ndarray((8, 8), nl.bfloat16, buffer=nl.psum),
                                                    stationary=sb((128, 8)), moving=sb((128, 8))),
                        "dst must be float32 PSUM"),
    "accumulate onto memset psum": (lambda x, i: _acc_memset(False), lambda x, i: _acc_memset(True),
                                    "initialised by a non-matmul instruction"),
    "nc_transpose dst dtype": (
        lambda x, i: nisa.nc_transpose(dst=nl.ndarray((8, 128), nl.float32, buffer=nl.psum), data=_filled((128, 8))),
        lambda x, i: nisa.nc_transpose(dst=nl.ndarray((8, 128), nl.bfloat16, buffer=nl.psum), data=_filled((128, 8))),
        "dst dtype bfloat16 must equal data dtype float32"),
    "tensor_scalar fp32 operand": (
        lambda x, i: nisa.tensor_scalar(dst=sb((128, 8)), data=_filled((128, 8)), op0=nl.multiply,
                                        operand0=_filled((128, 1))),
        lambda x, i: nisa.tensor_scalar(dst=sb((128, 8)), data=_filled((128, 8)), op0=nl.multiply,
                                        operand0=_filled((128, 1), nl.bfloat16)),
        "arithmetic operands must be float32"),
    "nl binary ops do not broadcast": (
        lambda x, i: nl.add(_filled((128, 8)), _filled((128, 8))),
        lambda x, i: nl.add(_filled((128, 1)), _filled((128, 8))), "not yet supported"),
    "hwdge gather": (
        lambda x, i: nisa.dma_copy(dst=sb((4, 8)), src=x.ap([[8, 4], [1, 8]], vector_offset=_idx(), indirect_dim=0),
                                   dge_mode=nisa.dge_mode.swdge),
        lambda x, i: nisa.dma_copy(dst=sb((4, 8)), src=x.ap([[8, 4], [1, 8]], vector_offset=_idx(), indirect_dim=0),
                                   dge_mode=nisa.dge_mode.hwdge),
        "hardware DGE cannot gather"),
    "dge none in fori_loop": (lambda x, i: _fori(nisa.dge_mode.hwdge), lambda x, i: _fori(nisa.dge_mode.none),
                              "not allowed inside nl.fori_loop"),
    "vector_offset on dim 0 only": (
        lambda x, i: x.ap([[8, 4], [1, 8]], vector_offset=_idx(), indirect_dim=0),
        lambda x, i: x.ap([[8, 4], [1, 8]], vector_offset=_idx(), indirect_dim=1), "only supports indirect_dim=0"),
    "vector_offset on HBM only": (
        lambda x, i: x.ap([[8, 4], [1, 8]], vector_offset=_idx(), indirect_dim=0),
        lambda x, i: sb((128, 8)).ap([[8, 4], [1, 8]], vector_offset=_idx(), indirect_dim=0),
        "needs the indexed tensor in HBM"),
    "vector_offset index in SBUF": (
        lambda x, i: x.ap([[8, 4], [1, 8]], vector_offset=_idx(), indirect_dim=0),
        lambda x, i: x.ap([[8, 4], [1, 8]], vector_offset=i, indirect_dim=0), "must be an index tile in SBUF"),
    "hwdge keeps dtype": (
        lambda x, i: nisa.dma_copy(dst=sb((128, 8)), src=x, dge_mode=nisa.dge_mode.hwdge),
        lambda x, i: nisa.dma_copy(dst=sb((128, 8), nl.bfloat16), src=x, dge_mode=nisa.dge_mode.hwdge),
        "hwdge copies cannot convert dtypes"),
    "tensor_tensor layout": (
        lambda x, i: nisa.tensor_tensor(dst=sb((128, 8)), data1=_filled((128, 8)), data2=_filled((128, 2, 4)), op=nl.add),
        lambda x, i: nisa.tensor_tensor(dst=sb((128, 8)), data1=_filled((128, 8)), data2=_filled((64, 16)), op=nl.add),
        "same partition count and elements per partition"),
    "gpsimd cannot access psum": (
        lambda x, i: nisa.tensor_copy(dst=sb((8, 8)), src=_filled((8, 8)), engine=nisa.engine.gpsimd),
        lambda x, i: nisa.tensor_copy(dst=sb((8, 8)), src=_psum((8, 8)), engine=nisa.engine.gpsimd),
        "GpSimd engine cannot access PSUM"),
    "enum members only": (
        lambda x, i: nisa.dma_copy(dst=sb((128, 8)), src=x, oob_mode=nisa.oob_mode.error),
        lambda x, i: nisa.dma_copy(dst=sb((128, 8)), src=x, oob_mode=0), "must be a member of nisa.oob_mode"),
}


def _filled(shape, dtype=nl.float32):
    t = sb(shape, dtype)
    nisa.memset(dst=t, value=1.0)
    return t


def _overlapping(first, second):
    a, b = _filled(first), _filled(second)
    nisa.tensor_copy(dst=a[:, 0:1], src=b[:, 0:1])      # a's last access after b's allocation


def _psum(shape):
    t = nl.ndarray(shape, nl.float32, buffer=nl.psum)
    nisa.memset(dst=t, value=1.0)
    return t


@pytest.mark.parametrize("name", sorted(CASES))
def test_check_must_pass_and_must_fail(name):
    ok, bad, msg = CASES[name]
    _run(ok)
    with pytest.raises((NkiValidationError, NotEmulatedError, TypeError), match=msg):
        _run(bad)


def test_accumulate_on_uninitialised_psum_warns():
    def body(x, i):
        a = _filled((128, 8), nl.bfloat16)
        ps = nl.ndarray((8, 8), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps, stationary=a, moving=a, accumulate=True)
    with pytest.warns(RuntimeWarning, match="uninitialised PSUM"):
        _run(body)


def test_unknown_names_and_outputs():
    with pytest.raises(AttributeError, match="module 'nki.isa' has no attribute 'multiply'"):
        nisa.multiply
    with pytest.raises(NotEmulatedError, match="nki.isa.bn_stats is not emulated"):
        nisa.bn_stats

    @nki.jit
    def k(x):
        o = nl.ndarray(x.shape, x.dtype, buffer=nl.hbm)
        nisa.dma_copy(dst=o, src=x)
        return o
    with pytest.raises(SyntaxError, match="output tensors must use nl.shared_hbm"):
        k(X)


def test_uninitialised_read_raises_and_garbage_propagates():
    def matmul_garbage(x, i):
        a = sb((128, 8), nl.bfloat16)
        ps = nl.ndarray((8, 8), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps, stationary=a, moving=a)
    with pytest.raises(nki_sim.errors.UninitializedReadError):
        _run(matmul_garbage)

    @nki.jit
    def k(x):
        t = sb((128, 8))
        nisa.dma_copy(dst=t[0:64], src=x[0:64])
        e = sb((128, 8))
        nisa.activation(dst=e, op=nl.exp, data=t)          # garbage rows 64.. stay garbage
        o = nl.ndarray((64, 8), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=e[0:64])
        bad = nl.ndarray((128, 8), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=bad, src=e)
        return o
    with pytest.raises(nki_sim.errors.UninitializedReadError, match="'dma_copy' reads 512"):
        k(X)


def test_invalid_keyword_arguments_raise():
    def body(x, i):
        nl.ndarray((128, 8), nl.float32, buffer=nl.sbuf, mask=None)
    with pytest.raises(TypeError, match="unexpected keyword argument 'mask'"):
        _run(body)

    def body2(x, i):
        nisa.tensor_tensor(dst=sb((128, 8)), data1=x, data2=x, op=nl.add, dtype=nl.float32)
    with pytest.raises(TypeError, match="unexpected keyword argument 'dtype'"):
        _run(body2)


def test_address_placement_fits_memory_and_nkiobject_keywords():
    def ok(x, i):
        for j in range(12):        # placed tensors reuse addresses: not summed as live bytes
            nl.ndarray((128, 512), nl.float32, buffer=nl.psum, address=(0, (j % 8) * 2048))
    _run(ok)

    def bad(x, i):
        nl.ndarray((128, 512), nl.float32, buffer=nl.psum, address=(0, 7 * 2048 + 4))
    with pytest.raises(NkiValidationError, match="bank"):
        _run(bad)

    def bad2(x, i):
        nl.ndarray((64, 1024), nl.float32, buffer=nl.sbuf, address=(96, 0))
    with pytest.raises(NkiValidationError, match="does not fit"):
        _run(bad2)

    import dataclasses

    @dataclasses.dataclass
    class Params(nl.NKIObject):
        idx = None
    p = Params(idx=3)
    assert p.idx == 3


def _late_read(how):
    """A 200000 B / partition tile ``a`` read by ``how`` after a 40000 B tile ``b`` exists."""
    a = _filled((128, 50000))
    b = _filled((128, 10000))
    if how == "dma":
        out = nl.ndarray((128, 1), nl.float32, buffer=nl.hbm)
        nisa.dma_copy(dst=out, src=a[:, 0:1])
    elif how == "matmul":
        ps = nl.ndarray((8, 8), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps, stationary=a[:, 0:8], moving=b[:, 0:8])
    elif how == "activation":
        nisa.activation(dst=b[:, 0:1], op=nl.exp, data=a[:, 0:1])
    elif how == "view":
        t = sb((128, 1))
        nisa.tensor_copy(dst=t, src=a.view(nl.int32)[:, 0:1])


@pytest.mark.parametrize("how", ["dma", "matmul", "activation", "view"])
def test_every_access_path_extends_a_tensors_lifetime(how):
    # must-fail: the late read keeps `a` live beside `b` (240000 > 212984 B per partition);
    # must-pass: the same kernel without it (each tile dead before the next)
    _run(lambda x, i: [_filled((128, 50000)), _filled((128, 10000))])
    with pytest.raises(NkiValidationError, match="SBUF capacity exceeded"):
        _run(lambda x, i: _late_read(how))
