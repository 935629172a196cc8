"""Measured speed and memory: the model table, scaling with length, and generation speed.

- :func:`run_bench` (``longrange bench``): training and inference throughput and peak memory of
  named models, relative to a reference model.
- :func:`run_scaling` (``longrange bench --scaling``): time and memory of a training step of each
  primitive as the sequence length doubles, with the fitted growth exponent.
- :func:`run_generation` (``longrange bench --generation``): per-token latency of recurrent
  generation at given positions, against recomputing the parallel forward over the prefix.
"""

from longrange.bench.generation import run_generation
from longrange.bench.models import DEFAULT_MODELS, MODELS, Workload, resolve_model, run_bench
from longrange.bench.scaling import run_scaling

__all__ = ["DEFAULT_MODELS", "MODELS", "Workload", "resolve_model", "run_bench", "run_generation", "run_scaling"]
