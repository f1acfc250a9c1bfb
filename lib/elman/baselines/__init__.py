"""Baselines (Mamba2, Gated DeltaNet, cuDNN GRU/LSTM, Llama), one module each;
`elman.registry` collects their `ENTRIES` in this order. mamba-ssm and
flash-linear-attention are imported when a layer of theirs is built, not here."""
from . import gdn, llama, mamba2, rnn

MODULES = (mamba2, gdn, rnn, llama)
