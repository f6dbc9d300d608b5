"""Where in the kernel source a statement sits (for err_shared_hbm_must_in_kernel_level).

``shared_hbm`` tensors may only be created at the top level of the kernel function: not in a
loop, not under an ``if``, not in a function the kernel calls (NKI error catalogue).  The caller
frame tells us the function; the kernel's AST (parsed once per code object) tells us whether
the line is nested in an ``if`` / ``for`` / ``while`` / ``with`` / ``try`` block.

Which ``if`` counts: the catalogue's example conditions on ``nl.program_id``, a value the
legacy tracer keeps symbolic, whereas an ``if`` on a trace-time Python constant (a kernel
keyword, a config attribute, ``x is not None``) is decided by Python before the front end
sees the statement; AWS's flash_fwd creates its ``lse`` output under ``if config.training:``
and AWS's simulation CI runs that path.  So each enclosing ``if`` test is classified from
the kernel's AST:

* ``program``: it uses ``program_id`` directly or through a name assigned from it (a
  flow-insensitive fixpoint over the kernel's assignments) -> the error;
* ``unclear``: it calls a function other than a few trace-time queries (the callee could read
  ``program_id``) -> a :class:`~nki_sim.errors.NkiFrontEndWarning`, not an error;
* ``const``: anything else -> accepted.
"""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
import warnings

from ..errors import NkiFrontEndWarning
from ..trace import in_simulator

_LOOPS = (ast.For, ast.While, ast.With, ast.Try, ast.AsyncFor, ast.AsyncWith)
# calls whose result is a trace-time constant (builtins and NKI queries that do not vary
# between SPMD programs)
_CONST_CALLS = frozenset({
    "len", "isinstance", "getattr", "hasattr", "min", "max", "abs", "int", "float", "bool",
    "tuple", "list", "type", "all", "any", "program_ndim", "num_programs", "get_nc_version"})
_cache: dict = {}


def _call_name(node: ast.Call) -> str:
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def _uses_program(expr, dependent: set) -> bool:
    for n in ast.walk(expr):
        if isinstance(n, ast.Call) and _call_name(n) == "program_id":
            return True
        if isinstance(n, ast.Name) and n.id in dependent:
            return True
    return False


def _program_dependent_names(func) -> set:
    """Names assigned (anywhere in the kernel) from an expression that uses program_id."""
    dependent: set = set()
    changed = True
    while changed:
        changed = False
        for node in ast.walk(func):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.NamedExpr)):
                value = node.value
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
                value, targets = node.iter, [node.target]
            else:
                continue
            if value is None or not _uses_program(value, dependent):
                continue
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name) and n.id not in dependent:
                        dependent.add(n.id)
                        changed = True
    return dependent


def classify_condition(test, dependent: set) -> str:
    """'program' / 'unclear' / 'const' for an ``if`` test (see the module docstring)."""
    if _uses_program(test, dependent):
        return "program"
    if any(isinstance(n, ast.Call) and _call_name(n) not in _CONST_CALLS for n in ast.walk(test)):
        return "unclear"
    return "const"


def _nested_blocks(code) -> list:
    """(first, last, kind, test source) of block bodies nested in the kernel function, with
    absolute source lines; kind is 'loop' (for / while / with / try) or the if classification."""
    if code in _cache:
        return _cache[code]
    blocks = []
    try:
        lines, start = inspect.getsourcelines(code)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        _cache[code] = blocks
        return blocks
    func = next((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
    if func is not None:
        dependent = _program_dependent_names(func)
        for node in ast.walk(func):
            if isinstance(node, ast.If):
                kind, test = classify_condition(node.test, dependent), ast.unparse(node.test)
            elif isinstance(node, _LOOPS):
                kind, test = "loop", ""
            else:
                continue
            if node.body:
                blocks.append((node.body[0].lineno + start - 1, node.end_lineno + start - 1, kind, test))
    _cache[code] = blocks
    return blocks


def caller_frame():
    """The innermost frame outside the nki_sim package."""
    f = sys._getframe(1)
    while f is not None and in_simulator(f):
        f = f.f_back
    return f


def warn_at_kernel_line(message: str, category) -> None:
    """Warn at the kernel statement being simulated (once per source line, like a compiler)."""
    f = caller_frame()
    if f is None:
        warnings.warn(message, category, stacklevel=2)
        return
    registry = f.f_globals.setdefault("__warningregistry__", {})
    warnings.warn_explicit(message, category, f.f_code.co_filename, f.f_lineno,
                           module=f.f_globals.get("__name__", "kernel"), registry=registry)


def outside_kernel_level(kernel_code) -> str:
    """'' if the calling statement is at the top level of the kernel function, else why not.

    An ``if`` on a trace-time constant does not count; one the AST cannot classify warns."""
    f = caller_frame()
    if f is None or kernel_code is None:
        return ""
    if f.f_code is not kernel_code:
        return f"inside function '{f.f_code.co_name}' called by the kernel"
    line = f.f_lineno
    unclear = []
    for lo, hi, kind, test in _nested_blocks(kernel_code):
        if not lo <= line <= hi:
            continue
        if kind == "loop":
            return f"inside a block (for / while / with / try) at line {line}"
        if kind == "program":
            return f"inside an if on the SPMD program id ({test}) at line {line}"
        if kind == "unclear":
            unclear.append(test)
    if unclear:
        warn_at_kernel_line(
            f"shared_hbm tensor created under 'if {unclear[0]}', whose condition calls a function "
            "nki_sim cannot classify: accepted as a trace-time constant; if it depends on "
            "nl.program_id the NKI front end rejects it (err_shared_hbm_must_in_kernel_level)",
            NkiFrontEndWarning)
    return ""
