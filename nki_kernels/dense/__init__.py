"""The dense vLLM-interface flash paged-attention kernel (legacy API): driver, flash step, in-kernel block tables and vectorized KV loads."""
