"""Kernel families: one package each (its op with the autograd Function and path choice,
its input factory, its cell benchmark). `dense` holds one W_h h per step plus an elementwise
epilogue; the diagonal, matrix-state and two-GEMM families follow the same layout."""
