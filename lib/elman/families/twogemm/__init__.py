"""The two-GEMM family: recurrences whose step needs two dependent matrix products (the
low-rank U (V h) of E4, E5, E66, E67lr; W_h w and W_wr w of E23's tape memory)."""
