"""longrange: long-sequence models, self-pretraining and fair comparison on long-range benchmarks."""

__version__ = "0.1.0"
