"""The dense family: one W_h h per step and an elementwise epilogue (E0, E1, ...)."""
