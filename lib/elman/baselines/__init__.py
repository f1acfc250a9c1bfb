"""Baselines (Mamba2, Gated DeltaNet, GRU/LSTM, Llama); importing this package registers them."""
