"""The module objects of the current front end: ``nki``, ``nki.language``, ``nki.isa``,
``nki.isa.constants``, ``nki.typing``, ``nki.compiler``, ``nki.lnc``, ``nki.simulator``,
``nki.collectives``.

Names that depend on the simulated NKI release (:mod:`nki_sim.current.version`) are served by a
module ``__getattr__`` (absent = ``AttributeError``); names of the real API that are not emulated
raise :class:`~nki_sim.errors.NotEmulatedError` (an ``AttributeError``) naming them.
"""

from __future__ import annotations


import types

from ..errors import NotEmulatedError
from . import control, creation, enums, isa_compute, isa_dma, isa_misc, isa_select, launch, lnc, nl_ops

from . import version
from .checks import NkiValidationError
from .scalars import NkiScalar, VirtualRegister
from .tensor import hbm, private_hbm, psum, sbuf, shared_hbm
from .ndarray import NkiTensor

_NOT_EMULATED = {
    "nki.isa": {"local_gather", "max8", "nc_find_index8", "nc_match_replace8",
                "bn_stats", "bn_aggr", "dropout", "sequence_bounds", "tensor_tensor_scan", "exponential",
                "nc_matmul_mx", "rand2", "rand_set_state", "rand_get_state", "set_rng_seed",
                "tensor_scalar_cumulative", "nonzero_with_count", "quantize_mx", "dma_copy_dynamic",
                "sendrecv_compute", "builtin_custom_op"},
    "nki.language": {"rand", "random_seed", "softmax", "mean", "var", "prod", "all", "any",
                     "rms_norm", "gather_flattened", "tiles", "blocks", "alloc_tiles", "alloc_blocks",
                     "shared_constant", "shared_identity_matrix", "full_like", "ones_like", "exp2",
                     "invert", "bitwise_not", "logical_not", "static_cast", "broadcast_to"},
    "nki.lnc": {"sendrecv_compute"},
}
# name -> (first version, last version or None)
_GATED = {
    "nki.isa": {"scalar_load": ((0, 7), None), "scalar_store": ((0, 7), None), "NkiScalar": ((0, 7), None),
                "sendrecv": ((0, 6), (0, 7)), "core_barrier": ((0, 6), (0, 7))},
    "nki.language": {"if_else": ((0, 8), None), "dynamic_range": ((0, 6), (0, 6)), "int64": ((0, 7), None)},
    "nki": {"lnc": ((0, 8), None)},
}


def _module(name: str, doc: str, attrs: dict, gated: dict) -> types.ModuleType:
    m = types.ModuleType(name, doc)
    m.__nki_sim__ = True
    m.__dict__.update({k: v for k, v in attrs.items() if k not in gated})
    not_emu = _NOT_EMULATED.get(name, set())

    def __getattr__(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        if attr in gated:
            lo, hi = gated[attr]
            if version.has(lo) and (hi is None or version.current() <= hi):
                return attrs[attr]
            raise AttributeError(f"module '{name}' has no attribute '{attr}' in NKI {version.fmt()} "
                                 f"(available from {version.fmt(lo)}"
                                 f"{'' if hi is None else ' to ' + version.fmt(hi)})")
        if attr in not_emu:
            raise NotEmulatedError(f"{name}.{attr} is not emulated by nki_sim")
        raise NotEmulatedError(f"module '{name}' has no attribute '{attr}' (unknown to nki_sim's "
                               "emulation of the current NKI API)")
    m.__getattr__ = __getattr__
    return m


class _NKIObjectMeta(type):
    """Keyword arguments a subclass's ``__init__`` does not take become attributes: nki-library
    builds ``@dataclass`` NKIObjects whose class attributes carry no annotations
    (``SectionParams(section_idx=...)``), which AWS's toolchain accepts."""

    def __call__(cls, *args, **kwargs):
        import inspect
        try:
            params = inspect.signature(cls.__init__).parameters
        except (TypeError, ValueError):
            params = {}
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            return super().__call__(*args, **kwargs)
        extra = {k: kwargs.pop(k) for k in list(kwargs) if k not in params}
        obj = super().__call__(*args, **kwargs)
        for k, v in extra.items():
            setattr(obj, k, v)
        return obj


class NKIObject(metaclass=_NKIObjectMeta):
    """Base class kernels may derive trace-time objects from (``nl.NKIObject``)."""


class _FP32:
    min = -3.4028234663852886e38
    max = 3.4028234663852886e38


def _language():
    a = {n: n for n in ("float32", "float16", "bfloat16", "tfloat32", "float8_e4m3", "float8_e4m3fn",
                        "float8_e5m2", "int8", "int16", "int32", "uint8", "uint16", "uint32")}
    a.update(bool_="bool", int64="int64", fp32=_FP32, ndarray=creation.ndarray, NkiTensor=NkiTensor,
             sbuf=sbuf, psum=psum, hbm=hbm, private_hbm=private_hbm, shared_hbm=shared_hbm,
             zeros=creation.zeros, ones=creation.ones, full=creation.full,
             zeros_like=creation.zeros_like, empty_like=creation.empty_like,
             program_id=creation.program_id, num_programs=creation.num_programs,
             program_ndim=creation.program_ndim, tile_size=creation.tile_size, ds=nl_ops.ds,
             load=nl_ops.load, store=nl_ops.store, copy=nl_ops.copy, matmul=nl_ops.matmul,
             transpose=nl_ops.transpose, reciprocal=nl_ops.reciprocal, where=nl_ops.where,
             sum=nl_ops.sum_, max=nl_ops.max_, min=nl_ops.min_, device_print=nl_ops.device_print,
             affine_range=control.affine_range, sequential_range=control.sequential_range,
             static_range=control.static_range, fori_loop=control.fori_loop,
             while_loop=control.while_loop, if_else=control.if_else,
             dynamic_range=control.dynamic_range, no_reorder=control.no_reorder, NKIObject=NKIObject)
    a.update(nl_ops.BINARY)
    a.update(nl_ops.UNARY)
    return a


class NkiInstruction:
    """Handle an ISA instruction returns (SDK 2.28+); ``depends_on`` adds an ordering edge, which
    the eager simulator already satisfies (every instruction completes before the next)."""

    __slots__ = ("op", "name")

    def __init__(self, op, name=""):
        self.op, self.name = op, name

    def depends_on(self, *others):
        return self

    def __repr__(self):
        return f"<NkiInstruction {self.op}{' ' + self.name if self.name else ''}>"


def _instruction(fn):
    import functools

    @functools.wraps(fn)
    def op(*args, **kwargs):
        fn(*args, **kwargs)
        return NkiInstruction(fn.__name__, kwargs.get("name", ""))
    return op


_RETURNS_VALUE = {"get_nc_version", "get_nc_sub_version", "scalar_load", "register_alloc"}


def _isa():
    a = {n: getattr(isa_compute, n) for n in (
        "nc_matmul", "nc_transpose", "activation", "activation_reduce", "tensor_tensor",
        "tensor_scalar", "tensor_reduce", "tensor_copy", "tensor_copy_predicated", "reciprocal",
        "memset", "nc_stream_shuffle", "scalar_tensor_tensor")}
    a.update({n: getattr(isa_select, n) for n in ("iota", "affine_select", "range_select", "select_reduce",
                                                  "tensor_scalar_reduce", "tensor_partition_reduce")})
    a.update({n: getattr(isa_dma, n) for n in ("dma_copy", "dma_transpose", "dma_compute")})
    a.update({n: getattr(isa_misc, n) for n in (
        "get_nc_version", "get_nc_sub_version", "scalar_load", "scalar_store", "register_alloc",
        "register_move", "register_load", "register_store")})
    a.update({n: getattr(enums, n) for n in (
        "engine", "reduce_cmd", "dge_mode", "oob_mode", "matmul_perf_mode", "nc_version", "dma_engine")})
    a.update(sendrecv=lnc.sendrecv, core_barrier=lnc.core_barrier)
    a = {n: (_instruction(f) if callable(f) and not isinstance(f, type) and n not in _RETURNS_VALUE else f)
         for n, f in a.items()}
    a.update(NkiInstruction=NkiInstruction, NkiScalar=NkiScalar, VirtualRegister=VirtualRegister,
             NkiValidationError=NkiValidationError,
             tensor_engine=enums.engine.tensor, vector_engine=enums.engine.vector,
             scalar_engine=enums.engine.scalar, gpsimd_engine=enums.engine.gpsimd,
             unknown_engine=enums.engine.unknown)
    return a


class _Subscriptable(type):
    def __getitem__(cls, item):
        return cls


class tensor(metaclass=_Subscriptable):
    """``nt.tensor[shape, dtype]`` annotation (documentation only)."""


class mutable_tensor(tensor):
    """Kept for source compatibility: every HBM argument is writable in the current API."""


class CompileConfig:
    def __init__(self, **kwargs):
        self.options = kwargs


class SpecializationConfig(CompileConfig):
    pass


def build() -> dict:
    """Fresh module objects keyed by their ``sys.modules`` names."""
    lang = _module("nki.language", "nki_sim emulation of nki.language", _language(), _GATED["nki.language"])
    isa_attrs = _isa()
    isa = _module("nki.isa", "nki_sim emulation of nki.isa", isa_attrs, _GATED["nki.isa"])
    consts = _module("nki.isa.constants", "enums of nki.isa",
                     {n: isa_attrs[n] for n in ("engine", "reduce_cmd", "dge_mode", "oob_mode",
                                                "matmul_perf_mode", "nc_version", "dma_engine")}, {})
    isa.constants = consts
    typing = _module("nki.typing", "nki.typing annotations",
                     {"tensor": tensor, "mutable_tensor": mutable_tensor, "scalar": int}, {})
    compiler = _module("nki.compiler", "nki.compiler configuration objects",
                       {"CompileConfig": CompileConfig, "SpecializationConfig": SpecializationConfig}, {})
    lnc_mod = _module("nki.lnc", "nki.lnc (NKI 0.8)", {"sendrecv": lnc.sendrecv,
                                                         "core_barrier": lnc.core_barrier}, {})
    simulator = _module("nki.simulator", "nki.simulator", {"simulate_kernel": launch.simulate_kernel}, {})
    collectives = _module("nki.collectives", "nki.collectives (not emulated)", {}, {})
    root_attrs = {"jit": launch.jit, "simulate": launch.simulate, "language": lang, "isa": isa,
                  "typing": typing, "compiler": compiler, "lnc": lnc_mod, "simulator": simulator,
                  "collectives": collectives, "__version__": "0.8.0"}
    root = _module("nki", "nki_sim emulation of the current NKI API (nki 0.8)", root_attrs, _GATED["nki"])
    root.__path__ = []
    for m in (lang, isa, consts, typing, compiler, lnc_mod, simulator, collectives):
        m.__nki_sim__ = True
    return {"nki": root, "nki.language": lang, "nki.isa": isa, "nki.isa.constants": consts,
            "nki.typing": typing, "nki.compiler": compiler, "nki.lnc": lnc_mod,
            "nki.simulator": simulator, "nki.collectives": collectives}


_CACHE: dict = {}


def modules() -> dict:
    if not _CACHE:
        _CACHE.update(build())
    return _CACHE



