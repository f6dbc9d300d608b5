"""Run kernels with single-threaded OpenBLAS.

The simulator issues thousands of small matmuls (<= 128x128x512); OpenBLAS's thread pool
makes each of them 5-30x slower on a busy 2-core machine (measured: 0.8 ms single-threaded
vs 4-23 ms with 2 threads under load).  ``single_threaded()`` sets the thread count of the
OpenBLAS bundled with NumPy's wheel to 1 for the duration of a kernel run and restores it.
Best effort: a no-op when the library or its symbols cannot be found (e.g. MKL builds).
The thread count is process-wide: with kernels running in several threads it is set to 1 when
the first run starts and restored when the last one ends.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import threading

_API = None
_lock = threading.Lock()
_active = 0          # kernel runs (in any thread) inside single_threaded()
_saved = None        # thread count to restore when the last run ends


def _find():
    global _API
    if _API is not None:
        return _API or None
    with _lock:
        if _API is None:
            _API = _load()
    return _API or None


def _load():
    try:
        import numpy
        libdir = os.path.join(os.path.dirname(numpy.__file__), os.pardir, "numpy.libs")
        for path in glob.glob(os.path.join(libdir, "*openblas*")):
            lib = ctypes.CDLL(path)
            for prefix in ("scipy_openblas", "openblas"):
                for suffix in ("64_", ""):
                    try:
                        s = getattr(lib, f"{prefix}_set_num_threads{suffix}")
                        g = getattr(lib, f"{prefix}_get_num_threads{suffix}")
                    except AttributeError:
                        continue
                    s.argtypes, s.restype, g.restype = [ctypes.c_int], None, ctypes.c_int
                    return (s, g)
    except Exception:
        pass
    return False


@contextlib.contextmanager
def single_threaded():
    api = _find()
    if not api:
        yield
        return
    global _active, _saved
    setter, getter = api
    with _lock:
        if _active == 0:
            _saved = getter()
            setter(1)
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            if _active == 0:
                setter(_saved)
