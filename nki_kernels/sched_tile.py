"""The KV tile of one scheduled-kernel item (``nki_kernels.scheduled_attention``): its K / V
row gathers (cache rows and, for partial items, overlay rows) and its K^T.

Device code (legacy NKI). ``cfg`` is the kernel's static configuration (``d``, ``nd``, ``kd``
the kernel dtype, ``fp8_direct``), ``geo`` the phase's geometry (``bp`` tokens per row,
``loads`` 128-row loads per tile, ``W`` keys per tile, ``kv_flat`` the cache viewed as rows of
``bp`` tokens: ``(2, N*Hkv*T, bp*d)``); ``mi`` the metadata chunk (int32; item columns from
``ci``: ``kv[l]`` then, masked, ``ov[l]``; docs/layouts.md §16.4).

Tile layout: row p of load l at columns ``[l*bp*d, (l+1)*bp*d)``, token s of that row at
``l*bp*d + s*d``; K^T column ``l*128*bp + s*128 + p`` is that key (tile-local index
``(l*128 + p)*bp + s``).
"""

from __future__ import annotations

import numpy as np

from nki_kernels._nki import nl, nisa
from nki_kernels.constants import B_P_SIZE
from nki_kernels.tile_ops import pe_matmul_transpose_blocks, pe_transpose_blocks


def gather_kv(cfg, geo, masked, mi, ci, hbm, bufs):
    """K and V rows of the item's tile (the phase's geometry ``geo``), ``(128, nL * b' * d)``
    each, and the overlay rows when they live in tiles of their own:
    ``(k_rows, v_rows, k_ov, v_ov)``.

    Cache rows are gathered in the cache dtype (no conversion inside an indirect DMA) into a
    zeroed tile (masked items: rows no DMA writes must be exact zeros) or the phase's persistent
    tile (full items write every row). A 16-bit cache (or any cache of the kernel dtype) is used
    as gathered and the overlay rows land in the same tile (``k_ov = v_ov = None``).

    fp8 caches with a 16-bit kernel dtype (``cfg["fp8_direct"]``): the fp8 rows are TensorE
    operands as they are (K through identity matmuls, V in the PV matmul), so no engine converts
    them; the overlay rows (kernel dtype: new tokens are not quantized) go to zeroed tiles of
    their own, ``k_ov`` / ``v_ov``, that TensorE adds in (each tile is zero where the other
    holds a row). Other dtype pairs (an fp8 cache with float32 kernel dtype: TensorE takes
    float32 only with float32) are converted on ScalarE and the overlay rows gathered into the
    converted tile.
    """
    P = B_P_SIZE
    nL, kd = geo["loads"], cfg["kd"]
    rw = geo["bp"] * cfg["d"]
    kv_flat, overlay = geo["kv_flat"], hbm["overlay"]
    cdt = kv_flat.dtype
    direct = cfg["fp8_direct"]
    k_ov = v_ov = None
    if masked:
        k_rows = _zeroed((P, nL * rw), cdt, nisa.gpsimd_engine)
        v_rows = _zeroed((P, nL * rw), cdt, nisa.vector_engine)
        if direct:
            k_ov = _zeroed((P, nL * rw), kd, nisa.gpsimd_engine)
            v_ov = _zeroed((P, nL * rw), kd, nisa.vector_engine)
    else:
        k_rows, v_rows = bufs["kv"]
    i_p = nl.arange(P)[:, None]
    i_f = nl.arange(rw)[None, :]
    same = np.dtype(overlay.dtype) == np.dtype(cdt)
    for l in nl.static_range(nL):
        nisa.dma_copy(dst=k_rows[i_p, l * rw + i_f], src=kv_flat[0, mi[i_p, ci + l], i_f],
                      oob_mode=nisa.oob_mode.skip)
        nisa.dma_copy(dst=v_rows[i_p, l * rw + i_f], src=kv_flat[1, mi[i_p, ci + l], i_f],
                      oob_mode=nisa.oob_mode.skip)
        if masked and (same or direct):
            _gather_overlay(k_ov if direct else k_rows, v_ov if direct else v_rows, overlay, mi,
                            ci + nL + l, l * rw, rw)
    if not direct and np.dtype(cdt) != np.dtype(kd):
        k_rows = nisa.tensor_copy(k_rows, dtype=kd, engine=nisa.scalar_engine)
        v_rows = nisa.tensor_copy(v_rows, dtype=kd, engine=nisa.scalar_engine)
        if masked and not same:      # overlay rows in the kernel dtype (fp8 cache)
            for l in nl.static_range(nL):
                _gather_overlay(k_rows, v_rows, overlay, mi, ci + nL + l, l * rw, rw)
    return k_rows, v_rows, k_ov, v_ov


def _zeroed(shape, dtype, engine):
    """A new SBUF tile of zeros. A 1-byte (fp8) tile with an even free size is zeroed as its
    16-bit view (all-zero bits either way): half the elements for the memset to write."""
    if np.dtype(dtype).itemsize == 1 and shape[1] % 2 == 0:
        t = nl.ndarray((shape[0], shape[1] // 2), dtype=nl.bfloat16, buffer=nl.sbuf)
        t[...] = nisa.memset((shape[0], shape[1] // 2), 0.0, dtype=nl.bfloat16, engine=engine)
        return t.view(dtype)
    t = nl.ndarray(shape, dtype=dtype, buffer=nl.sbuf)
    t[...] = nisa.memset(shape, 0.0, dtype=dtype, engine=engine)
    return t


def transpose_keys(cfg, geo, k_rows, k_ov, eye):
    """K^T of the tile: nd SBUF tiles ``(dk, W)`` in the kernel dtype (channel slice k holds
    channels [128k, 128k + dk); column order of ``sched_core.key_index_tile``). PE transposes of
    the kernel-dtype rows, or identity matmuls of the fp8 rows (``eye``: the identities of the
    cache dtype and the kernel dtype) plus the overlay rows ``k_ov`` when given."""
    P = B_P_SIZE
    d, nd, bp, nL, kd = cfg["d"], cfg["nd"], geo["bp"], geo["loads"], cfg["kd"]
    rw = bp * d
    fp8 = eye is not None and np.dtype(k_rows.dtype) != np.dtype(kd)
    k_t = []
    for k in nl.static_range(nd):
        dk = min(P, d - k * P)
        kt = nl.ndarray((dk, geo["W"]), dtype=kd, buffer=nl.sbuf)
        for l in nl.static_range(nL):
            # one 128-key block per (load, token s): nd == 1 reads b' adjacent d-wide blocks
            col, width, nblk = ((l * rw, d, bp) if nd == 1 else (l * rw + k * P, dk, 1))
            for s in nl.static_range(1 if nd == 1 else bp):
                c0 = col + s * d
                if fp8:
                    parts = [(k_rows, c0, eye[0])]
                    if k_ov is not None:
                        parts.append((k_ov, c0, eye[1]))
                    pe_matmul_transpose_blocks(kt, l * P * bp + s * P, parts, width, nblk,
                                               evac_engine=nisa.scalar_engine)
                else:
                    pe_transpose_blocks(kt, l * P * bp + s * P, k_rows, c0, width, nblk,
                                        evac_engine=nisa.scalar_engine)
        k_t.append(kt)
    return k_t


def _gather_overlay(k_rows, v_rows, overlay, mi, col, c0, rw):
    """Overlay rows of one load into columns ``[c0, c0 + rw)`` (rows not listed are skipped)."""
    i_p = nl.arange(B_P_SIZE)[:, None]
    i_f = nl.arange(rw)[None, :]
    nisa.dma_copy(dst=k_rows[i_p, c0 + i_f], src=overlay[0, mi[i_p, col], i_f],
                  oob_mode=nisa.oob_mode.skip)
    nisa.dma_copy(dst=v_rows[i_p, c0 + i_f], src=overlay[1, mi[i_p, col], i_f],
                  oob_mode=nisa.oob_mode.skip)
