"""The KV-cache kernels: the ``reshape_and_cache`` write, the MLA latent-cache write, and block copy / swap."""
