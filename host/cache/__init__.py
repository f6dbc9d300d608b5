"""KV-cache layouts and operations: write, copy and swap on the project layout and on vLLM's block-KV pair; the MLA latent cache and its write."""
