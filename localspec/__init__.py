"""localspec: lossless speculative decoding on llama.cpp kernels, batch 1, local."""

__version__ = "0.1.0"
