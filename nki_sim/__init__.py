"""nki_sim: a NumPy simulator of the legacy NKI (``neuronxcc.nki``, "Beta 1") programming model."""
