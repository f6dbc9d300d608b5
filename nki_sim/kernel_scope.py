"""Where in the kernel source a statement sits (for err_shared_hbm_must_in_kernel_level).

``shared_hbm`` tensors may only be created at the top level of the kernel function: not in a
loop, not under an ``if``, not in a function the kernel calls.  The caller frame tells us the
function; the kernel's AST (parsed once per code object) tells us whether the line is nested
in an ``if`` / ``for`` / ``while`` / ``with`` / ``try`` block.
"""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap

from .trace import in_simulator

_NESTED = (ast.If, ast.For, ast.While, ast.With, ast.Try, ast.AsyncFor, ast.AsyncWith)
_cache: dict = {}


def _nested_line_ranges(code) -> list:
    """(first, last) absolute source lines of block bodies nested in the kernel function."""
    if code in _cache:
        return _cache[code]
    ranges = []
    try:
        lines, start = inspect.getsourcelines(code)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        _cache[code] = ranges
        return ranges
    func = next((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
    if func is not None:
        for node in ast.walk(func):
            if isinstance(node, _NESTED) and node.body:
                ranges.append((node.body[0].lineno + start - 1, node.end_lineno + start - 1))
    _cache[code] = ranges
    return ranges


def caller_frame():
    """The innermost frame outside the nki_sim package."""
    f = sys._getframe(1)
    while f is not None and in_simulator(f):
        f = f.f_back
    return f


def outside_kernel_level(kernel_code) -> str:
    """'' if the calling statement is at the top level of the kernel function, else why not."""
    f = caller_frame()
    if f is None or kernel_code is None:
        return ""
    if f.f_code is not kernel_code:
        return f"inside function '{f.f_code.co_name}' called by the kernel"
    line = f.f_lineno
    for lo, hi in _nested_line_ranges(kernel_code):
        if lo <= line <= hi:
            return f"inside a block (if / for / while / with / try) at line {line}"
    return ""
