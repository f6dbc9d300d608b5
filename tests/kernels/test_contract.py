"""The host-kernel contract is defined once (nki_kernels/contract.py): no other module of
nki_kernels/ or host/ assigns its values from literals, the names both sides import are the
contract's objects, and the metadata layout matches the columns the kernels read."""

from __future__ import annotations

import ast
import importlib
import itertools
import pathlib

import pytest

from nki_kernels import contract

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Names (and old aliases) of contract values: assigning any of them from a literal elsewhere is a
# second definition.
WATCHED = {"P", "PARTITIONS", "PMAX", "B_P_SIZE", "B_F_SIZE", "PSUM_BANK_F32", "STEP_KEYS",
           "NEG_MASK", "M_FLOOR", "L_FLOOR", "DECODE_MAX_ROWS", "DECODE_LAYOUT_MAX_ROWS",
           "MAX_CHUNK", "MAX_CHUNK_ITEMS", "MAX_GROUP_BLOCKS", "SBUF_USABLE", "FP32_EXACT_INT",
           "STATE_BUDGET_BYTES", "BLOCK_TABLE_BUDGET_BYTES", "MAX_HEAD_SIZE_SCHEDULED",
           "MAX_HEAD_SIZE", "MIN_BLOCK_SIZE", "MAX_BLOCK_SIZE", "MIN_LARGE_TILE", "MAX_LARGE_TILE"}


def _literal(node) -> bool:
    """A literal, or arithmetic / a dict / a tuple of literals."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float))
    if isinstance(node, ast.UnaryOp):
        return _literal(node.operand)
    if isinstance(node, ast.BinOp):
        return _literal(node.left) and _literal(node.right)
    if isinstance(node, ast.Dict):
        return all(_literal(v) for v in node.values)
    if isinstance(node, ast.Tuple):
        return all(_literal(v) for v in node.elts)
    return False


def _second_definitions(package: str) -> list[str]:
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        if path.name == "contract.py" and path.parent.name == "nki_kernels":
            continue
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.Assign):
                continue
            for target in node.targets:
                names = ([target] if isinstance(target, ast.Name)
                         else list(target.elts) if isinstance(target, ast.Tuple) else [])
                for n in names:
                    if isinstance(n, ast.Name) and n.id in WATCHED and _literal(node.value):
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} {n.id}")
    return found


def test_kernel_side_defines_no_contract_value():
    assert _second_definitions("nki_kernels") == []


def test_host_side_defines_no_contract_value():
    assert _second_definitions("host") == []


def test_the_checker_finds_a_second_definition(tmp_path, monkeypatch):
    pkg = tmp_path / "fake"
    pkg.mkdir()
    (pkg / "m.py").write_text("DECODE_MAX_ROWS = 64\nOTHER = 3\nP, Q = 128, 1\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    assert _second_definitions("fake") == ["fake/m.py:1 DECODE_MAX_ROWS", "fake/m.py:3 P"]


@pytest.mark.parametrize("module, name", [
    ("nki_kernels.constants", "M_FLOOR"), ("nki_kernels.constants", "NEG_MASK"),
    ("nki_kernels.scheduled.sched_plan", "SBUF_USABLE"), ("nki_kernels.sbuf_plan", "SBUF_USABLE"),
    ("nki_kernels.mla.mla_sbuf", "SBUF_USABLE"), ("nki_kernels.scheduled.sched_checks", "tile_geometry"),
    ("nki_kernels.scheduled.sched_plan", "meta_layout"), ("nki_kernels.scheduled.sched_plan", "decode_layout"),
    ("nki_kernels.scheduled.scheduled_attention", "chunk_size"),
    ("nki_kernels.scheduled.sched_config", "meta_layout"),
])
def test_kernel_modules_read_the_contract_objects(module, name):
    assert getattr(importlib.import_module(module), name) is getattr(contract, name)


def test_host_and_kernel_read_the_same_objects():
    # both sides' schedule-building code reaches the contract's SBUF table and layout function
    import host.scheduled.schedule as hs
    from nki_kernels.scheduled import sched_plan
    assert hs.max_group_blocks is sched_plan.max_group_blocks
    assert sched_plan.SBUF_USABLE is contract.SBUF_USABLE
    assert hs.meta_columns is sched_plan.meta_columns


def test_old_names_are_the_contract_values():
    from nki_kernels import constants

    assert (constants.B_P_SIZE, constants.B_F_SIZE) == (contract.PARTITIONS, contract.PSUM_BANK_F32)
    assert constants.DECODE_LAYOUT_MAX_ROWS == contract.DECODE_MAX_ROWS
    g = contract.tile_geometry(16, 1024)
    assert constants.tile_geometry(16, 1024) == (g.M, g.T, g.bp, g.L, g.nL)


@pytest.mark.parametrize("B, LT", [(1, 512), (16, 512), (16, 2048), (32, 2048), (256, 8192),
                                   (128, 512)])
def test_tile_geometry(B, LT):
    g = contract.tile_geometry(B, LT)
    assert g.M * B == LT and g.L == max(g.M, contract.PARTITIONS) and g.L == g.M * g.T
    assert g.bp * g.T == B and g.nL * contract.PARTITIONS == g.L and g.W == LT


def test_meta_layout_columns_are_disjoint_and_dense():
    for loads, blocks, d, masked, alibi, row_init, kop in itertools.product(
            (1, 4), (1, 3), (64, 300), (False, True), (False, True), (False, True),
            (False, True)):
        if alibi and not row_init:
            continue
        m = contract.meta_layout(loads=loads, blocks=blocks, head_size=d, masked=masked,
                                 alibi=alibi, row_init=row_init, keys_on_partitions=kop)
        nd = contract.channel_slices(d)
        # group-major: one Q^T column per channel slice, one state / output / init column
        spans = [(m.kv, loads), (m.ov, loads if masked else 0),
                 (m.q, 0 if kop else nd), (m.st, 1),
                 (m.out, 1 if masked else 0), (m.ini, 1 if row_init and not kop else 0)]
        cols = sorted(c for start, n in spans if start is not None for c in range(start, start + n))
        assert cols == list(range(m.ki))
        fcols = [m.reset] + ([m.bounds + i for i in range(2 * blocks)] if m.bounds is not None
                             else []) + ([m.k0] if m.k0 is not None else [])
        assert sorted(fcols) == list(range(m.kf))
        assert (m.bounds is not None) == (masked and not kop) and (m.k0 is not None) == alibi


def test_chunk_size():
    assert [contract.chunk_size(n) for n in (0, 1, 6, 64, 96, 128, 640)] == [1, 1, 2, 64, 32, 64,
                                                                             64]
    assert contract.decode_layout(contract.DECODE_MAX_ROWS, 1)
    assert not contract.decode_layout(contract.DECODE_MAX_ROWS + 1, 1)
    assert not contract.decode_layout(16, 2)
