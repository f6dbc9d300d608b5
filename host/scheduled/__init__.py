"""Scheduled-kernel planning: the block-sparse schedule, its items, and the kernel inputs of each class (one launch per class, or both classes of a mixed batch in one pair launch)."""
