"""Destination-passing engine operations (API-neutral): TensorE, VectorE, ScalarE, GpSimd, DMA.

Each op takes core views (:class:`nki_sim.tensor.Tensor`) and plain Python / NumPy parameters,
reads its operands through the checked accesses of :mod:`nki_sim.access` (bounds, uninitialised
reads), computes in fp32 (exact int64 for integer-exact ALU ops, :mod:`nki_sim.alu`), writes the
destination with the storage cast rules and records one trace event with the same engine / op /
shape / byte fields the legacy front end records for the same work, so :mod:`nki_sim.cost`
charges both alike.  No front end's argument conventions live here.
"""

from . import dma, gpsimd, scalar, tensor_engine, vector  # noqa: F401
