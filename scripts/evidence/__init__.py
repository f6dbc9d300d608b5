"""Hardware-evidence suite: published measurements vs the cost model (see scripts/bench_evidence.py)."""
