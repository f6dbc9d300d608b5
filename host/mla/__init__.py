"""MLA (multi-head latent attention): validation, plan, the overlay of new tokens, and the float64 reference."""
