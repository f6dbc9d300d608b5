"""The host reads the host-kernel contract (nki_kernels.contract) instead of re-deriving it: the
names the host's planning modules use are the contract's objects, and the host's geometry
helpers return the contract's values."""

from __future__ import annotations

import pytest

import host.cache.block_kv as hbk
import host.dense.block_tables as hb
import host.dense.plan as hp
import host.scheduled.schedule as hs
import host.scheduled.schedule_items as hi
import host.scheduled.scheduled as hsd
from nki_kernels import contract


@pytest.mark.parametrize("module, name", [
    (hs, "DECODE_MAX_ROWS"), (hs, "MAX_GROUP_BLOCKS"), (hs, "MAX_CHUNK"), (hs, "chunk_size"),
    (hs, "meta_layout"), (hs, "decode_layout"), (hs, "tile_geometry"), (hs, "channel_slices"),
    (hi, "TileGeometry"), (hi, "tile_geometry"), (hp, "PARTITIONS"), (hp, "tile_geometry"),
    (hb, "PARTITIONS"), (hsd, "M_FLOOR"), (hsd, "Q_INIT_COLUMNS"),
])
def test_host_modules_use_the_contract_objects(module, name):
    assert getattr(module, name) is getattr(contract, name)


@pytest.mark.parametrize("B, LT", [(1, 512), (16, 512), (32, 2048), (256, 8192)])
def test_host_geometry_helpers_return_the_contract_geometry(B, LT):
    g = contract.tile_geometry(B, LT)
    assert hb.tile_geometry(B, LT) == (g.M, g.T, g.bp, g.L)
    assert hi.item_geometry(B, LT) == (g.T, g.bp, g.L, g.nL)
    p = hp.make_plan([1], [LT], block_size=B, large_tile_size=LT)
    assert (p.blocks_per_tile, p.tiling_factor, p.tiled_block_size, p.rows_per_tile) == (
        g.M, g.T, g.bp, g.L)


def test_schedule_metadata_follows_the_contract_layout():
    import numpy as np

    s = hs.make_schedule([3, 1], [40, 700], np.array([[0, 1, 2] + [-1] * 41, list(range(3, 47))]),
                         num_heads=8, num_kv_heads=2, head_size=64, block_size=16, num_blocks=47,
                         large_tile_size=512, alibi=True, row_init=True)
    for cls in s.classes:
        for phase in (cls.full, cls.partial):
            lay = contract.meta_layout(loads=s.loads if not phase.masked else s.partial_loads,
                                       blocks=cls.blocks, head_size=64, masked=phase.masked,
                                       alibi=True, row_init=True,
                                       keys_on_partitions=cls.decode_layout)
            assert phase.meta_i.shape[2] == phase.items * lay.ki
            assert phase.meta_f.shape[1] == phase.items * lay.kf
            mf = phase.meta_f.reshape(128, phase.items, lay.kf)
            assert (mf[:, :phase.real_items, lay.reset] >= 0).all()
            assert mf[0, 0, lay.reset] == 1.0                     # a group starts at item 0


def test_cache_write_row_limit_is_the_contracts_on_both_sides():
    import nki_kernels.cache.kv_cache_update as kw
    import nki_kernels.cache.mla_cache_update as mw
    for value in (hbk.MAX_ROW_BYTES, kw.MAX_ROW_BYTES, mw.MAX_ROW_BYTES):
        assert value is contract.CACHE_WRITE_MAX_ROW_BYTES
