"""Run the docstring examples of the host modules owned by this part so they cannot drift."""

import doctest

import pytest

import host.dense.block_tables
import host.dense.masks
import host.dense.plan
import host.reference
import host.step_plan
import host.variants


@pytest.mark.parametrize("module", [host.dense.plan, host.dense.block_tables, host.dense.masks, host.reference,
                                    host.variants, host.step_plan],
                         ids=lambda m: m.__name__)
def test_doctests(module):
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
