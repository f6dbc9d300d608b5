"""The dense vLLM-interface flash paged-attention kernel (both NKI APIs, on the op layer): driver, flash step, in-kernel block tables and vectorized KV loads."""
