"""elman: minimal recurrent networks (the E-series Elman variants), their CUDA kernels,
the protocols that compare them, and the helpers the book's chapters call."""
__version__ = "0.1.0"
