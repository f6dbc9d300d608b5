"""The MLA paged-attention kernel (built on the scheduled family's steps): driver, configuration and SBUF budget."""
