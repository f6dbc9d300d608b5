"""Dense-kernel planning: the flat batch plan, its masks, block tables and GQA packing (the inputs of the vLLM-interface flash kernel)."""
