"""The state-tracking tasks as generated tasks: ``parity``, ``modular-arithmetic`` and
``modular-arithmetic-brackets`` (Grazzi et al. 2025, arXiv 2411.12537, on the xLSTM code's formal
languages; layouts in :mod:`longrange.data.generate.state_tracking`).

    load_task("parity", seed=0)                                  # train on 3-40, test on 40-256
    load_task("modular-arithmetic-brackets", seed=0, mult=False)  # + and - alone

The training split draws lengths ``min_len .. max_len``, validation and test
``eval_min_len .. eval_max_len``: the published protocol trains on short sequences (3 to 40) and
selects and tests on long ones (40 to 256), so a model that fits the training lengths without
tracking the state fails the held-out splits. Examples are drawn when read, as the other generated
tasks' (:mod:`longrange.data.synthetic`), item ``i`` of a split from
``numpy.random.default_rng([seed, task, split, epoch, i])``.

Defaults are the published settings: modulus 2 for parity, 5 for the arithmetic (the xLSTM code's
``vocab_size`` 3, 10 and 12), and the split sizes of its configurations (``count``): 8,192
validation and test examples, and one fresh example per training example seen (20,000 steps of
batch 256 for parity, 100,000 for the arithmetic). The answer is asked at the last position alone,
so accuracy is per sequence; chance is ``1 / modulus``.
"""

from __future__ import annotations

import functools
from typing import Any

from longrange.data.generate.sequences import Example
from longrange.data.generate.state_tracking import (
    STATE_TRACKING,
    ModularArithmetic,
    ModularArithmeticBrackets,
    Parity,
    StateTracking,
)
from longrange.data.synthetic import GeneratedSplit, register_generated
from longrange.data.tokenize import FIRST_TOKEN_ID

#: Bumped whenever a state-tracking generator's output for the same options and seed changes.
STATE_TRACKING_GENERATOR_VERSION = 1

#: The published training examples: steps x batch of the xLSTM code's configurations
#: (``parity_*.yaml``: 20,000 x 256; ``mod_arithmetic*.yaml``: 100,000 x 256).
_TRAIN_SIZES = {
    Parity.name: 20_000 * 256,
    ModularArithmetic.name: 100_000 * 256,
    ModularArithmeticBrackets.name: 100_000 * 256,
}

_TEXT = {
    Parity: (
        "Parity (state tracking): the sum of the symbols modulo 2 (or modulus), trained short, tested long",
        "generated: n-1 uniform symbols, then the query; the answer at the query. Train lengths "
        "min_len..max_len, validation and test eval_min_len..eval_max_len",
    ),
    ModularArithmetic: (
        "Modular arithmetic (state tracking): the value of a + b * c - ... modulo 5, trained short, tested long",
        "generated: numbers and operators + - * in turn, '=', the query; the answer at the query. Train "
        "lengths min_len..max_len, validation and test eval_min_len..eval_max_len",
    ),
    ModularArithmeticBrackets: (
        "Modular arithmetic with brackets (state tracking): the value of a bracketed expression modulo 5",
        "generated: a fully bracketed expression of + - * (+ - with mult false), '=', the query; the answer at "
        "the query. Train lengths min_len..max_len, validation and test eval_min_len..eval_max_len",
    ),
}


class StateTrackingSplit(GeneratedSplit):
    """A split of a state-tracking task: the training split draws the training lengths, the
    others the held-out lengths."""

    def draw(self, rng: Any) -> Example:
        return self.generator.draw(rng, training=self.split == "train")


def _classes(generator: StateTracking) -> int:
    return generator.vocab_size + FIRST_TOKEN_ID


def _register(cls: type[StateTracking]) -> None:
    description, layout = _TEXT[cls]
    splits: dict[str, Any] = {"n_train": _TRAIN_SIZES[cls.name], "n_val": 8192, "n_test": 8192, "fresh_train": False}
    register_generated(
        cls,
        splits,
        description=description,
        layout=layout,
        per_position=True,
        causal=False,
        n_classes=_classes,
        split_class=StateTrackingSplit,
        version=STATE_TRACKING_GENERATOR_VERSION,
    )


for _cls in STATE_TRACKING.values():
    _register(_cls)


# --------------------------------------------------------------------------- readers of new inputs
def _register_readers() -> None:
    """``longrange predict`` reads new inputs of the state-tracking tasks as JSON Lines, as those of
    the other generated sequence tasks (``{"id", "tokens", "answers"}``, tokens by number: the
    numbers ``0 .. modulus - 1``, then the symbols in the order of the layout, the query last); the
    position scored is the last, after the reference solver has read the expression."""
    from longrange.data.inputs import SEQUENCE_LAYOUTS, SequenceLayout, read_sequence_inputs, register_input_reader
    from longrange.errors import DataFormatError

    def scored(tokens, obj, gen, path, number) -> list[int]:
        try:
            gen.solve(tokens)
        except ValueError as err:
            raise DataFormatError(f"field 'tokens': {err}", path, number) from None
        return [len(tokens) - 1]

    def answer_range(gen: StateTracking) -> tuple[int, int, str]:
        return (*gen.answers, "a number")

    for name in STATE_TRACKING:
        SEQUENCE_LAYOUTS[name] = SequenceLayout(("id", "tokens", "answers"), scored, answer_range)
        register_input_reader(name, functools.partial(read_sequence_inputs, name))


_register_readers()
