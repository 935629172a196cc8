"""longrange: long-sequence models, self-pretraining and fair comparison on long-range benchmarks.

from longrange import load_run
run = load_run("runs/listops")        # a finished run's model, vocabulary and evaluation
"""

__version__ = "0.1.0"

from longrange._exports import lazy_exports  # noqa: E402

_EXPORTS = {"load_run": "longrange.train.trained", "load_model": "longrange.train.trained"}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
