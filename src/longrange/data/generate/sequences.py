"""Generators of the synthetic sequence tasks on which sequence architectures part at small scale.

Each generator draws one example from one random stream (:mod:`longrange.data.generate.base`) in
*task tokens* ``0 .. vocab_size - 1``; the tasks (``data/synthetic.py``) shift them past the five
special ids. An example has per-position ``targets`` (the answer at each position that asks one,
:data:`~longrange.data.batch.IGNORE_INDEX` elsewhere) or a class ``label``. Each generator's
``solve`` is the reference solver: a few lines that read the answers off the inputs (a filter, a
dictionary lookup), so that a test can check that the labels mean what they say.

Layouts (``L`` = ``seq_len``; docs/data.md gives the published settings and where ours differ):

* :class:`SelectiveCopying` (Mamba paper §3.1, layout of the S4 code's copying data set with
  ``variable=True``): token 0 is noise, ``1 .. V-2`` data, ``V-1`` the marker. ``n_tokens`` data
  tokens (uniform, with repeats) at distinct random positions among the first ``L - n_tokens``, noise
  elsewhere, then ``n_tokens`` markers; the answer at the i-th marker is the i-th data token.
* :class:`InductionHeads` (Mamba paper §4.1.2, layout of the safari synthetics): tokens
  ``0 .. V-2`` are data, ``V-1`` the trigger. Uniform data tokens, one trigger at a random position
  ``p`` in ``[0, L-3]``, a trigger at the last position; the answer there is the token after ``p``.
* :class:`MultiQueryAR` (Zoology's MQAR, ``zoology/data/associative_recall.py::_mqar``): keys
  ``1 .. V//2 - 1``, values ``V//2 .. V-1``; ``n_pairs`` distinct keys with distinct values as
  key-value pairs first, then each key once as a query at position ``2 n_pairs + 2 g`` with gaps
  ``g`` drawn without replacement from ``[0, (L - 2 n_pairs) // 2)`` with probability
  ``∝ a k^(a-1)`` (``k = g + 1``, ``a = power_a``); the answer at a query is its key's value. Other
  positions hold token 0, or uniform tokens of the whole vocabulary with ``random_filler``.
  With ``answers_in_input`` each query's value also follows it in the input (the text-like form).
* :class:`AssociativeRecall`: the single-query form as a classification: the key-value pairs of
  MQAR, filler, and one of the keys at the last position; the label is the index of its value
  among the values (``value - V//2``). With ``n_recalls`` other keys are recalled before the
  query, each followed by its value, at random even offsets after the pairs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from longrange.data.batch import IGNORE_INDEX
from longrange.data.generate.base import Generator, check_bool, check_int, check_positive


@dataclass
class Example:
    """One generated example in task tokens: ``inputs`` (L,), and per-position ``targets`` (L,) or a
    class ``label``."""

    inputs: np.ndarray
    targets: np.ndarray | None = None
    label: int | None = None
    #: (L,) bool: the input tokens that recall determines (a value after its key seen earlier in the
    #: sequence): where a model pretrained on the inputs shows whether it has learned to recall. None
    #: when the layout has none.
    recalled: np.ndarray | None = None


def _answers_at(positions: np.ndarray, answers: np.ndarray, length: int) -> np.ndarray:
    targets = np.full(length, IGNORE_INDEX, dtype=np.int64)
    targets[positions] = answers
    return targets


# ------------------------------------------------------------------------------------- copying
@dataclass(frozen=True)
class SelectiveCopying(Generator):
    """Selective copying: output the data tokens, in order, at the markers (see the module docstring)."""

    name: ClassVar[str] = "selective-copying"
    NOISE: ClassVar[int] = 0

    vocab_size: int = 16
    seq_len: int = 4096
    n_tokens: int = 16

    @property
    def marker(self) -> int:
        return self.vocab_size - 1

    @property
    def n_answers(self) -> int:
        """The possible answers: the data tokens ``1 .. V-2``."""
        return self.vocab_size - 2

    def check(self) -> None:
        check_int(self.name, "vocab_size", self.vocab_size, 3, why="noise, marker and at least one data token")
        check_int(self.name, "seq_len", self.seq_len, 2)
        check_int(
            self.name,
            "n_tokens",
            self.n_tokens,
            1,
            self.seq_len // 2,
            why=f"the data tokens and their markers take 2 * n_tokens of the seq_len {self.seq_len} positions",
        )

    def draw(self, rng: np.random.Generator) -> Example:
        L, M = self.seq_len, self.n_tokens
        tokens = rng.integers(1, self.vocab_size - 1, size=M)
        positions = np.sort(rng.choice(L - M, size=M, replace=False))
        inputs = np.full(L, self.NOISE, dtype=np.int64)
        inputs[positions] = tokens
        inputs[L - M :] = self.marker
        return Example(inputs, _answers_at(np.arange(L - M, L), tokens, L))

    def solve(self, inputs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(positions asked, answers): the markers, and the tokens that are neither noise nor marker."""
        asked = np.flatnonzero(inputs == self.marker)
        return asked, inputs[(inputs != self.NOISE) & (inputs != self.marker)]


@dataclass(frozen=True)
class InductionHeads(Generator):
    """Induction heads: after the second trigger, the token that followed the first (module docstring)."""

    name: ClassVar[str] = "induction-heads"

    vocab_size: int = 16
    seq_len: int = 256

    @property
    def trigger(self) -> int:
        return self.vocab_size - 1

    @property
    def n_answers(self) -> int:
        """The possible answers: the data tokens ``0 .. V-2`` (the trigger never follows a trigger)."""
        return self.vocab_size - 1

    def check(self) -> None:
        check_int(self.name, "vocab_size", self.vocab_size, 2, why="the trigger and at least one data token")
        check_int(self.name, "seq_len", self.seq_len, 3, why="a trigger, the token after it and the final trigger")

    def draw(self, rng: np.random.Generator) -> Example:
        L = self.seq_len
        inputs = rng.integers(0, self.trigger, size=L)
        p = int(rng.integers(0, L - 2))
        inputs[p] = inputs[L - 1] = self.trigger
        return Example(inputs, _answers_at(np.array([L - 1]), inputs[p + 1 : p + 2], L))

    def solve(self, inputs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(positions asked, answers): the last position, and the token after the first trigger."""
        first = int(np.flatnonzero(inputs == self.trigger)[0])
        return np.array([len(inputs) - 1]), inputs[first + 1 : first + 2]


# -------------------------------------------------------------------------------------- recall
@dataclass(frozen=True)
class _KeyValues(Generator):
    """Key-value pairs first: ``n_pairs`` distinct keys from ``1 .. V//2 - 1``, distinct values from
    ``V//2 .. V-1``."""

    vocab_size: int = 8192
    seq_len: int = 64
    n_pairs: int = 4
    random_filler: bool = False

    def check(self) -> None:
        n = check_int(self.name, "n_pairs", self.n_pairs, 1)
        check_int(
            self.name,
            "vocab_size",
            self.vocab_size,
            2 * n + 2,
            why=f"keys 1 .. vocab_size // 2 - 1 and values vocab_size // 2 .. vocab_size - 1 for {n} "
            "distinct keys and values",
        )
        check_bool(self.name, "random_filler", self.random_filler)

    @property
    def first_value(self) -> int:
        return self.vocab_size // 2

    @property
    def n_answers(self) -> int:
        """The possible answers: the values ``V//2 .. V-1``."""
        return self.vocab_size - self.first_value

    def pairs(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(keys, values, inputs with the pairs in front and token 0 elsewhere)."""
        n = self.n_pairs
        keys = rng.choice(self.first_value - 1, size=n, replace=False) + 1
        values = rng.choice(self.vocab_size - self.first_value, size=n, replace=False) + self.first_value
        inputs = np.zeros(self.seq_len, dtype=np.int64)
        inputs[0 : 2 * n : 2], inputs[1 : 2 * n : 2] = keys, values
        return keys, values, inputs

    def fill(self, rng: np.random.Generator, inputs: np.ndarray, free: np.ndarray) -> None:
        """Uniform tokens of the whole vocabulary at the ``free`` positions, with ``random_filler``."""
        if self.random_filler:
            inputs[free] = rng.integers(0, self.vocab_size, size=int(free.sum()))

    def lookup(self, inputs: np.ndarray) -> dict[int, int]:
        """The reference solver's dictionary: key -> value of the pairs in front."""
        n = self.n_pairs
        return dict(zip(inputs[0 : 2 * n : 2].tolist(), inputs[1 : 2 * n : 2].tolist()))


@dataclass(frozen=True)
class MultiQueryAR(_KeyValues):
    """Multi-query associative recall: each key queried once after the pairs (module docstring)."""

    name: ClassVar[str] = "mqar"

    power_a: float = 0.01
    #: The value also follows each query in the input (the text-like form, in which the inputs hold
    #: recall events that self-pretraining can read; Zoology's inputs have filler there).
    answers_in_input: bool = False

    def check(self) -> None:
        super().check()
        check_int(
            self.name,
            "seq_len",
            self.seq_len,
            4 * self.n_pairs,
            why=f"{self.n_pairs} key-value pairs, then {self.n_pairs} queries at even offsets after them",
        )
        check_positive(self.name, "power_a", self.power_a, why="the queries' gaps have probability ∝ a k^(a-1)")
        check_bool(self.name, "answers_in_input", self.answers_in_input)

    def gap_probabilities(self) -> np.ndarray:
        """The probability of each gap ``0 .. space - 1`` when one gap is drawn."""
        space = (self.seq_len - 2 * self.n_pairs) // 2
        k = np.arange(1, space + 1, dtype=np.float64)
        p = self.power_a * k ** (self.power_a - 1)
        return p / p.sum()

    @functools.cached_property
    def _log_gap_probabilities(self) -> np.ndarray:
        return np.log(self.gap_probabilities())

    def gaps(self, rng: np.random.Generator) -> np.ndarray:
        """``n_pairs`` distinct gaps, drawn one after another with the probabilities of the gaps left
        (as ``numpy.random.choice(..., replace=False, p=...)``), by the Gumbel top-k trick: the
        ``n_pairs`` largest ``log p + Gumbel noise``, in decreasing order, are such draws."""
        scores = self._log_gap_probabilities + rng.gumbel(size=self._log_gap_probabilities.shape)
        top = np.argpartition(-scores, self.n_pairs - 1)[: self.n_pairs]
        return top[np.argsort(-scores[top])]

    def draw(self, rng: np.random.Generator) -> Example:
        keys, values, inputs = self.pairs(rng)
        gaps = self.gaps(rng)
        queries = 2 * self.n_pairs + 2 * gaps
        inputs[queries] = keys
        free = np.ones(self.seq_len, dtype=bool)
        free[: 2 * self.n_pairs] = free[queries] = False
        recalled = None
        if self.answers_in_input:
            inputs[queries + 1] = values
            free[queries + 1] = False
            recalled = np.zeros(self.seq_len, dtype=bool)
            recalled[queries + 1] = True
        self.fill(rng, inputs, free)
        return Example(inputs, _answers_at(queries, values, self.seq_len), recalled=recalled)

    def solve(self, inputs: np.ndarray, asked: np.ndarray) -> np.ndarray:
        """The answers at the ``asked`` positions: the value of the key found there."""
        values = self.lookup(inputs)
        return np.array([values[int(inputs[i])] for i in asked], dtype=np.int64)


@dataclass(frozen=True)
class AssociativeRecall(_KeyValues):
    """Single-query associative recall as a classification (module docstring)."""

    name: ClassVar[str] = "associative-recall"

    #: Other keys recalled in the input before the query, each followed by its value, at random even
    #: offsets after the pairs: recall events that self-pretraining on the inputs can read (0: none,
    #: the layout of Zoology's single-query form, whose inputs hold the query alone).
    n_recalls: int = 0

    @property
    def n_classes(self) -> int:
        return self.vocab_size - self.first_value

    @property
    def recall_slots(self) -> int:
        """Even offsets after the pairs where a recalled key (and its value after it) may sit."""
        return (self.seq_len - 1 - 2 * self.n_pairs) // 2

    def check(self) -> None:
        super().check()
        check_int(
            self.name,
            "seq_len",
            self.seq_len,
            2 * self.n_pairs + 1,
            why=f"{self.n_pairs} key-value pairs and the query",
        )
        check_int(
            self.name,
            "n_recalls",
            self.n_recalls,
            0,
            self.n_pairs - 1,
            why=f"recalled keys are other keys than the query's, of {self.n_pairs} pairs",
        )
        if self.n_recalls > self.recall_slots:
            check_int(
                self.name,
                "seq_len",
                self.seq_len,
                2 * self.n_pairs + 2 * self.n_recalls + 1,
                why=f"{self.n_pairs} key-value pairs, {self.n_recalls} recalled pairs and the query",
            )

    def draw(self, rng: np.random.Generator) -> Example:
        keys, values, inputs = self.pairs(rng)
        i = int(rng.integers(self.n_pairs))
        inputs[-1] = keys[i]
        free = np.zeros(self.seq_len, dtype=bool)
        free[2 * self.n_pairs : -1] = True
        recalled = None
        if self.n_recalls:
            others = np.delete(np.arange(self.n_pairs), i)
            chosen = rng.choice(others, size=self.n_recalls, replace=False)
            at = 2 * self.n_pairs + 2 * rng.choice(self.recall_slots, size=self.n_recalls, replace=False)
            inputs[at], inputs[at + 1] = keys[chosen], values[chosen]
            free[at] = free[at + 1] = False
            recalled = np.zeros(self.seq_len, dtype=bool)
            recalled[at + 1] = True
        self.fill(rng, inputs, free)
        return Example(inputs, label=int(values[i]) - self.first_value, recalled=recalled)

    def solve(self, inputs: np.ndarray) -> int:
        """The class of the last token's value."""
        return self.lookup(inputs)[int(inputs[-1])] - self.first_value
