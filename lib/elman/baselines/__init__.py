"""Baselines (Mamba2, Gated DeltaNet, cuDNN GRU/LSTM, Llama); importing this package
registers them, in this order. mamba-ssm and flash-linear-attention are imported when a
layer of theirs is built, not here."""
from . import mamba2, gdn, rnn, llama  # noqa: F401,I001
