"""A helper a kernel calls (``tests/sim/test_api_trace.py``: events attributed to the call site
with ``nki_sim.tracing(call_sites_past=...)``)."""
import neuronxcc.nki.language as nl


def doubled(t):
    return nl.multiply(t, 2.0)
