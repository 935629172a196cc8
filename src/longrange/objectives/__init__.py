"""Objectives: supervised losses and metrics, and the self-pretraining (SPT) objectives.

An objective turns a batch into a loss and additive sums of its metrics (see
:mod:`longrange.objectives.base`); they are registered by name in :data:`OBJECTIVES`::

    from longrange.objectives import OBJECTIVES
    objective = OBJECTIVES.build("masked", "tokens", 0.15, vocab_size=len(vocab))
"""

from longrange.objectives.base import OBJECTIVES, Objective, StepOutput, add_sums, register_objective
from longrange.objectives.pretraining import MaskedPrediction, NextTokenPrediction
from longrange.objectives.supervised import Classification, PositionClassification, Regression

__all__ = [
    "OBJECTIVES",
    "Classification",
    "MaskedPrediction",
    "NextTokenPrediction",
    "Objective",
    "PositionClassification",
    "Regression",
    "StepOutput",
    "add_sums",
    "register_objective",
]
