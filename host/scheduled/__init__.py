"""Scheduled-kernel planning: the block-sparse schedule, its items, and the kernel inputs of one launch per class."""
