"""Per-item pieces shared by the kernels that run ``host.schedule`` items
(``nki_kernels.scheduled_attention``, ``nki_kernels.mla_attention``): the group's Q^T (gathered
per group, or preloaded per metadata chunk in the decode layout), its carried state, the fold of
one KV tile into every Q block's online-softmax state, and the state / output stores.

Device code (legacy NKI). Metadata columns (``mi`` int32, ``mf`` fp32, one SBUF chunk of items;
``host.schedule.PhaseArrays``): ``q_col + j*nd + k`` the Q^T row of channel 128k + p of block j
(query-rows classes only), ``st_col + j`` / ``out_col + j`` the state / output row of query row p
of block j, fp32 column ``cf`` the reset flag followed by the mask bounds (masked items). Row
indices out of bounds skip the DMA (``oob_mode.skip``). The phases run full first (state to the
HBM scratch after a group's last full item), masked last (state loaded at a group's first masked
item, output after its last). The state of block j is ``st[:, j*(d+2) : (j+1)*(d+2)]``
(``nki_kernels.sched_core``).
"""

from __future__ import annotations

import numpy as np

from nki_kernels._nki import nl, nisa
from nki_kernels.constants import B_F_SIZE, B_P_SIZE, L_FLOOR
from nki_kernels.sched_core import flash_step
from nki_kernels.sched_decode import decode_step


def decode_step_keys(rows):
    """Keys per keys-on-partitions step: S^T (128, keys/128 * rows) fits one 2 KiB PSUM bank."""
    keys = B_P_SIZE
    while (2 * keys // B_P_SIZE) * rows <= B_F_SIZE and 2 * keys <= 2048:
        keys *= 2
    return keys


def chunk_queries(q_all, row0, head_size, col0, ncols, *, scale, kernel_dtype):
    """Decode layout: the Q^T of a metadata chunk's items, ``q_all`` rows ``[row0, row0 + d)``
    and columns ``[col0, col0 + ncols)`` (``host.scheduled.item_queries``), one load per
    <= 128-channel slice, scaled into ``kernel_dtype``; returns the nd slices."""
    out = []
    for k in nl.static_range(-(-head_size // B_P_SIZE)):
        dk = min(B_P_SIZE, head_size - k * B_P_SIZE)
        q_ld = nl.load(q_all[nl.ds(row0 + k * B_P_SIZE, dk), nl.ds(col0, ncols)])
        out.append(nisa.tensor_scalar(q_ld, np.multiply, scale, dtype=kernel_dtype))
    return out


def load_q_slices(q_raw, query_t, mi, q_col, *, rows, blocks, scale, kernel_dtype):
    """Query-rows classes: gather the group's Q^T into the persistent raw slices ``q_raw`` (nd
    SBUF tiles ``(dk, blocks*rows)``; rows whose index is out of bounds -- a group that does not
    start at this item -- keep their values) and return them scaled into ``kernel_dtype``."""
    nd = len(q_raw)
    i_q = nl.arange(rows)[None, :]
    scaled = []
    for k in nl.static_range(nd):
        i_c = nl.arange(q_raw[k].shape[0])[:, None]
        for j in nl.static_range(blocks):
            nisa.dma_copy(dst=q_raw[k][i_c, j * rows + i_q],
                          src=query_t[mi[i_c, q_col + j * nd + k], i_q],
                          oob_mode=nisa.oob_mode.skip)
        scaled.append(nisa.tensor_scalar(q_raw[k], np.multiply, scale, dtype=kernel_dtype))
    return scaled


def load_state(st, mi, st_col, state, *, rows, blocks, d):
    """Masked items: every block's state rows from ``state`` (rows of d + 2 fp32 left by the
    full phase; skipped unless the group starts here and had full items)."""
    sw = d + 2
    i_r = nl.arange(rows)[:, None]
    i_s = nl.arange(sw)[None, :]
    for j in nl.static_range(blocks):
        nisa.dma_copy(dst=st[i_r, j * sw + i_s], src=state[mi[i_r, st_col + j], i_s],
                      oob_mode=nisa.oob_mode.skip)


def fold_tile(q_slices, k_t, v_rows, st, mf, cf, *, d, rows, blocks, width, step, masked, kidx,
              kernel_dtype, keys_on_partitions, consts=None, chunk_bounds=None, it=0,
              soft_cap=None, v_stride=None, alibi_of=None, one_sided=False, v_overlay=None,
              tiled_block_size=None, p_evac=None):
    """Fold the tile's ``width`` keys into every block's state, ``step`` keys per step.

    ``keys_on_partitions`` (decode layout): ``sched_decode.decode_step`` with ``consts``
    (``decode_constants``); a masked item's bounds are its ``2 * rows`` columns of the chunk's
    one-partition ``chunk_bounds`` (c_q then r_q; item ``it`` of the chunk), broadcast to every
    partition by a ones matmul. Otherwise ``sched_core.flash_step`` per block, block j's bounds in
    fp32 columns ``cf + 1 + 2j``, ``cf + 2 + 2j`` of ``mf``; ``alibi_of(j)``: None or a function
    giving block j's ``(slope, off)`` ``(rows, 1)`` tiles (in the decode layout broadcast along
    the free axis first); ``one_sided``: no row's visible range starts inside a tile (no sliding
    window), so masks test the upper bound only; ``v_overlay``: None or a second V tile of
    ``v_rows``' layout added into every PV product (fp8 cache rows and 16-bit overlay rows kept
    apart, each zero where the other has a row); ``tiled_block_size``: the rows' b' (lets masked
    query-rows steps use ``range_select`` on NeuronCore-v3). P^T copies: decode blocks (few
    rows) are cheap anywhere; 128-row blocks put them on ScalarE on NeuronCore-v2 (whose slower
    VectorE carries the row max and the mask select) and split them 3:1 between ScalarE and
    VectorE on v3 (where range_select makes the masked max one VectorE pass); ``p_evac``
    overrides that choice (an engine or a tuple cycled over the copies).
    """
    sw = d + 2
    if p_evac is None and rows == B_P_SIZE:   # v2: VectorE (row max, mask select) is the busier
        p_evac = ((nisa.scalar_engine, nisa.scalar_engine, nisa.vector_engine)
                  if nisa.get_nc_version() == nisa.nc_version.gen3 else nisa.scalar_engine)
    for j in nl.static_range(blocks if keys_on_partitions else 0):
        bounds = None
        if masked:            # decode layout: the item's bounds broadcast to every partition
            b_ps = nl.ndarray((B_P_SIZE, 2 * rows), dtype=nl.float32, buffer=nl.psum)
            b_ps[...] = nisa.nc_matmul(consts["ones_f"],
                                       chunk_bounds[0:1, nl.ds(it * 2 * rows, 2 * rows)])
            b_sb = nl.copy(b_ps, dtype=nl.float32)
            bounds = (b_sb[:, nl.ds(0, rows)], b_sb[:, nl.ds(rows, rows)])
        alibi = None
        if alibi_of is not None:       # (slope, off) of every row on every key partition
            alibi = _rows_to_free_axis(alibi_of(j), rows, consts)
        for s0 in nl.static_range(width // step):
            decode_step([q[:, nl.ds(j * rows, rows)] for q in q_slices], k_t, v_rows, st, j * sw,
                        d, k0=s0 * step, width=step, kidx_t=kidx, bounds=bounds,
                        kernel_dtype=kernel_dtype, consts=consts, soft_cap=soft_cap,
                        v_stride=v_stride, v_overlay=v_overlay, alibi=alibi)
    for j in nl.static_range(0 if keys_on_partitions else blocks):
        bounds = None
        if masked:
            bounds = (mf[0:rows, nl.ds(cf + 1 + 2 * j, 1)], mf[0:rows, nl.ds(cf + 2 + 2 * j, 1)])
        alibi = alibi_of(j) if alibi_of is not None else None
        for s0 in nl.static_range(width // step):
            flash_step([q[:, nl.ds(j * rows, rows)] for q in q_slices], k_t, v_rows, st, j * sw,
                       d, k0=s0 * step, width=step, kidx=kidx, bounds=bounds,
                       kernel_dtype=kernel_dtype, soft_cap=soft_cap, p_evac=p_evac,
                       v_stride=v_stride, alibi=alibi, one_sided=one_sided,
                       v_overlay=v_overlay, tiled_block_size=tiled_block_size)


def _rows_to_free_axis(cols, rows, consts):
    """Decode layout: per-row ``(rows, 1)`` fp32 columns (rows on partitions) -> ``(128, rows)``
    fp32 tiles holding row q's value in column q of every partition (PE transposes into one
    one-partition row, then a ones matmul broadcasts it; all fp32, exact)."""
    n = len(cols)
    row_ps = nl.ndarray((1, n * rows), dtype=nl.float32, buffer=nl.psum)
    for i, col in enumerate(cols):
        row_ps[:, nl.ds(i * rows, rows)] = nisa.nc_transpose(col)
    row = nl.copy(row_ps, dtype=nl.float32)
    bc_ps = nl.ndarray((B_P_SIZE, n * rows), dtype=nl.float32, buffer=nl.psum)
    bc_ps[...] = nisa.nc_matmul(consts["ones_f"], row)
    bc = nl.copy(bc_ps, dtype=nl.float32)
    return tuple(bc[:, nl.ds(i * rows, rows)] for i in range(n))


def store_blocks(st, mi, col, out, state, *, rows, blocks, d, masked):
    """Full items: every block's state rows to ``state`` (rows of d + 2 fp32, state columns
    ``col + j``; skipped unless this is the group's last full item). Masked items: ``o / max(l,
    L_FLOOR)`` of every block to ``out`` (output columns ``col + j``; skipped unless the group
    ends here)."""
    sw = d + 2
    i_r = nl.arange(rows)[:, None]
    i_s = nl.arange(sw)[None, :]
    i_d = nl.arange(d)[None, :]
    for j in nl.static_range(blocks):
        if not masked:
            nisa.dma_copy(dst=state[mi[i_r, col + j], i_s], src=st[i_r, j * sw + i_s],
                          oob_mode=nisa.oob_mode.skip)
            continue
        l_safe = nl.maximum(st[:, nl.ds(j * sw + d + 1, 1)], L_FLOOR, dtype=nl.float32)
        o_tile = nl.divide(st[:, nl.ds(j * sw, d)], l_safe, dtype=out.dtype)
        nisa.dma_copy(dst=out[mi[i_r, col + j], i_d], src=o_tile[i_r, i_d],
                      oob_mode=nisa.oob_mode.skip)
