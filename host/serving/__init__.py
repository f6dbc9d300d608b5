"""Serving integrations: the KV-cache manager, the transformers backend and generator, and the torch ops (CPU and device paths)."""
