"""The scheduled (block-sparse) paged-attention kernel family: driver, configuration, checks, online-softmax steps, items, tiles and SBUF budget."""
