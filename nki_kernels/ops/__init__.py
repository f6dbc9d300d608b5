"""The project op layer: one kernel source per family, run on both NKI API generations.

Kernels never import an NKI package. They receive an *op layer* -- one module per API:

    ``nki_kernels.ops.legacy``   the legacy API (``neuronxcc.nki``; trn1 on SDK <= 2.28)
    ``nki_kernels.ops.current``  the current API (``import nki``, NKI 0.8 / SDK 2.34; trn2/trn3)

and call its destination-passing ops. Both modules provide the same names; the legacy one
lowers each op to the call the kernels made before the layer existed (same instructions), the
current one to the documented ``nisa.op(dst=..., ...)`` form (``.ap()`` / ``vector_offset``
indirect DMAs, plain ``range`` loops, no ``mask=``, no SPMD grid; its DMA ops live in
``nki_kernels.ops.current_dma``, re-exported; the legacy ones in ``legacy_dma``). Only these
modules (and
``nki_kernels.toolchain``, which chooses the API) name ``neuronxcc.nki`` or ``nki``.

Interface (``ops`` below is either module; ``dst`` is always written, never returned):

    names / dtypes   NAME ("legacy" | "nki"); float32 bfloat16 float16 int32 uint8 float8_e4m3
                     float8_e5m2; PRED (comparison results); FLAG (0/1 tiles selected with);
                     FP32_MIN
    allocation       sbuf(shape, dt) psum(shape, dt) zeros(shape, dt); HBM tensors by the
                     kernel function itself (outputs must be created at its top level):
                     ndarray(shape, dtype=dt, buffer=SHARED_HBM | PRIVATE_HBM); views: ds(start, size) (a slice),
                     free_view(t, ((step, count), ...), col0) (strided / broadcast free dims;
                     step 0 broadcasts), bitcast(t, dt), filled_as_words(shape, dt, fill) (a
                     1- or 2-byte tile written through its float32 view)
    loops, programs  static_range / parallel_range / sequential_range (legacy: nl.static_range /
                     affine_range / sequential_range; current: range); kv_heads(Hkv): the KV
                     heads this program runs (legacy: its SPMD program; current: all of them
                     in a loop, under LNC=2 this core's half, by ``nl.program_id(0)``);
                     launch_core(): ``(core, cores)`` of this program (legacy: ``(0, 1)``);
                     query_part(): ``(part, parts)`` of its head's query tiles (legacy grid
                     ``[nl.nc(2), Hkv]``: ``(program_id(0), 2)``; else ``(0, 1)``);
                     head_rows(table, head, rows_per_head, Hkv): where a head enters gathered
                     row ids (legacy: the ids, by iota; current: the DMA's HBM offset);
                     launch_grid(Hkv, lnc) (legacy: ``[1, Hkv]``, LNC=2 ``[1, nl.spmd_dim(
                     nl.nc(2), Hkv/2)]``; current: None); max_lnc()
    feature flags    nc_gen(), has_range_select(), has_oob_skip(), transpose_psum_dtype(dt),
                     has_gather_transpose(dt, width), has_sbuf_dma_transpose(dt),
                     has_select_max() (where_max: a select with its row max; current API)
                     (trace-time properties of the API and target; never "am I simulated")
    compute          memset iota copy activation (row_sum=: fused row sum) tensor_scalar
                     tensor_tensor scale_add floored_divisors + divide_by (a / max(l, floor), n
                     columns' divisors at once) where where_max (+ its row max; current API)
                     tensor_reduce (negate=) scalar_reduce
                     (``data op0 operand0`` and its row reduction) range_select_max (start=)
                     matmul (accumulate=) transpose; where_chunks(dst, dst_stride, pred, src,
                     n, width) (a select per chunk, one flag each), tensor_scalar_columns /
                     tensor_tensor_columns(dst, col0, stride, ...) (every ``stride``-th column,
                     one instruction); flags(src, col0, stride, n): 0/1 float
                     columns as predicates (``.column(i, rows)``; current API: converted once); engines by name ("scalar", "vector",
                     "gpsimd"), ALU ops and activation functions by name ("add", "exp", ...)
    DMA              load(dst, src) direct; gather(dst, table, idx, idx_col, lead=, col0=,
                     tokens=, step=) and scatter(table, idx, idx_col, src, lead=, col0=): row p
                     moves table row ``idx[p, idx_col]`` (an int32 SBUF column; gather: as
                     ``tokens`` pieces ``step`` elements apart), out-of-bounds rows skipped;
                     gather_transpose(dst, table, idx, idx_col, tokens=, width=, lead=, col0=,
                     step=, src_col0=): 128 gathered rows of ``tokens`` x ``width`` transposed
                     into ``dst`` (current API, v3+: one indirect dma_transpose; legacy: none);
                     transpose_on_dma(dst, dst_col, src, src_col, n_blocks, width): n_blocks
                     column blocks of an SBUF tile transposed into ``dst`` by one SBUF -> SBUF
                     dma_transpose (current API, v3+; legacy: none); dma_transpose_block(dst,
                     src): one 2-D block of a 2-byte dtype, SBUF -> SBUF (v3+, both APIs);
                     load_cast(dst, src): a direct load into another float dtype (current API:
                     the DMA keeps the dtype, ScalarE converts); dma(dst, src): a direct DMA
                     (e.g. SBUF -> HBM); gather_rows / scatter_rows / row_block / rows (the
                     cache kernels' row tiles; every index in bounds)
    launch checks    check_head_grid(kernel, Hkv, query_parts=): the legacy ``[1, Hkv]`` grid
                     (or ``[nl.nc(2), Hkv]`` with query_parts; ValueError; nothing on the
                     current API)

Porting a kernel onto the layer (what every product kernel family did):

1. Write the kernel body as ``def body(ops, ...)`` (or pass ``ops`` to each helper as its first
   argument); replace every ``nl`` / ``nisa`` call by its op: allocate the destination with
   ``ops.sbuf`` / ``ops.psum`` and pass it (``x = nisa.op(..., dtype=dt)`` becomes
   ``x = ops.sbuf(shape, dt); ops.op(x, ...)``), ``nl.arange`` index expressions by
   ``ops.ds`` slices / ``ops.free_view``, indirect DMAs ``t[idx[i_p, c], i_f]`` by
   ``ops.gather`` / ``ops.scatter``, ``np.dtype(t.dtype)`` by :func:`dtype_name` /
   :func:`itemsize` (current-API dtypes are strings).
2. Loops: ``ops.parallel_range`` where the legacy code had ``affine_range``,
   ``ops.sequential_range`` for loop-carried state, ``ops.static_range`` for Python decisions.
   The SPMD grid goes: ``for head in ops.kv_heads(Hkv):`` around the per-head body; outputs
   through ``ops.ndarray(..., buffer=ops.SHARED_HBM)`` in the kernel function itself,
   scratch with ``buffer=ops.PRIVATE_HBM``.
3. The entry point: a function building the kernel from an op layer, wrapped in
   :class:`KernelFamily`, which jits it once per API (``family.for_api("nki")``); indexing the
   family (``family[1, Hkv]``) is the legacy launch, as before.
4. Check legacy trace identity (same events and outputs as before the port, on trn1 and trn2),
   then run on the current front end; add a missing op to BOTH modules, documented for each API
   (docs/nki-compatibility-review.md) -- never a branch on the simulator.
"""

from __future__ import annotations

import importlib
import threading

import numpy as np

__all__ = ["for_api", "KernelFamily", "dtype_name", "itemsize", "APIS"]

APIS = ("legacy", "nki")
_MODULES = {"legacy": "nki_kernels.ops.legacy", "nki": "nki_kernels.ops.current"}


def for_api(api: str):
    """The op-layer module of ``api`` ("legacy" | "nki"); imports that API's NKI package."""
    if api not in _MODULES:
        raise ValueError(f"api must be one of {APIS}; got {api!r}")
    return importlib.import_module(_MODULES[api])


def dtype_name(dt) -> str:
    """Name of a tensor dtype on either API (``"bfloat16"``, ``"float8_e4m3"``, ...)."""
    if isinstance(dt, str):
        return dt
    return np.dtype(dt).name


_SIZES = {"float32": 4, "int32": 4, "uint32": 4, "bfloat16": 2, "float16": 2, "int16": 2,
          "uint16": 2, "float8_e4m3": 1, "float8_e5m2": 1, "float8_e4m3fn": 1, "int8": 1,
          "uint8": 1, "bool": 1}


def itemsize(dt) -> int:
    """Bytes per element of a tensor dtype on either API."""
    if isinstance(dt, str):
        return _SIZES[dt]
    return np.dtype(dt).itemsize


class KernelFamily:
    """One kernel source, jitted once per API on first use.

    ``build(ops)`` returns the undecorated kernel function written against the op layer
    ``ops``; ``for_api(api)`` returns ``ops.jit(build(ops))`` for that API (cached). Indexing
    the family with a grid is the legacy launch (``family[1, Hkv]``), so callers written for the
    legacy kernel object keep working.
    """

    def __init__(self, build, name: str, *, odd_heads: bool = False):
        self._build = build
        self.__name__ = name
        # the kernel runs an odd Hkv on two cores too (the dense kernel: on the current API
        # the heads but the last split by head, the last by query tiles; on the legacy API
        # every head by query tiles, grid [nl.nc(2), Hkv]; toolchain.Api.lnc)
        self.odd_heads = odd_heads
        self._jitted = {}
        self._lock = threading.Lock()

    def for_api(self, api: str):
        with self._lock:
            if api not in self._jitted:
                ops = for_api(api)
                self._jitted[api] = ops.jit(self._build(ops))
            return self._jitted[api]

    def __getitem__(self, grid):
        """``family[grid]``, the launch of callers written for the legacy kernel object (vLLM:
        ``flash_paged_attention[1, n_kv_heads](**kwargs)``): the legacy grid launch; where the
        installed toolchain is the real current ``nki`` (SDK 2.34: no legacy namespace), the
        current API's launch instead, at the compiler's LNC (``toolchain.Api.launch``: its
        kernel loops over the KV heads, the grid's last dimension)."""
        from nki_kernels import toolchain

        api = toolchain.resolve_api(None)
        if api.name == toolchain.CURRENT and not api.simulated:
            return _CurrentGridLaunch(self, api, grid)
        return self.for_api("legacy")[grid]

    def __repr__(self) -> str:
        return f"KernelFamily({self.__name__})"


class _CurrentGridLaunch:
    """``family[1, Hkv]`` on the current API (:meth:`KernelFamily.__getitem__`): calling it runs
    the family's current-API kernel over ``Hkv`` KV heads on the device at the compiler's LNC."""

    def __init__(self, family, api, grid):
        grid = grid if isinstance(grid, tuple) else (grid,)
        if not grid or not all(isinstance(g, int) and g >= 1 for g in grid) or any(
                g != 1 for g in grid[:-1]):
            raise ValueError(f"{family.__name__}[grid]: on the current NKI API the grid must be "
                             f"[1, n_kv_heads] of ints (the kernel loops over its KV heads); got "
                             f"{list(grid)}")
        self.family, self.api, self.heads = family, api, grid[-1]

    def __call__(self, *args, **kwargs):
        return self.api.launch(self.family, args, kwargs, num_kv_heads=self.heads, device=True)
