"""Generators of the state-tracking tasks: parity, modular arithmetic without and with brackets.

These are the formal-language tasks on which the eigenvalues of a linear recurrence decide what it
can learn (Grazzi et al. 2025, "Unlocking State-Tracking in Linear RNNs Through Negative
Eigenvalues", arXiv 2411.12537: a diagonal or delta-rule transition with eigenvalues in [0, 1]
cannot solve parity at any length, one with eigenvalues in [-1, 1] can; complex eigenvalues count
modulo 3), in the layouts of the xLSTM code those experiments run on (Beck et al. 2024; the
generators of ``xlstm/experiments/data/formal_language/tasks/`` in adankow/unlocking_state_tracking).
Every example is a sequence whose last position asks the answer; the model is trained on short
sequences and tested on long ones: a test of whether it tracks the state or fits the lengths.

Each generator draws one example in *task tokens* from one random stream
(:mod:`longrange.data.generate.base`): ``draw(rng, training)``, the training split's lengths
(``min_len .. max_len``) or the held-out splits' (``eval_min_len .. eval_max_len``). The length
is drawn uniformly as the xLSTM code draws it; examples have different lengths (a batch pads them at
the end). Targets hold the answer at the last position and
:data:`~longrange.data.batch.IGNORE_INDEX` elsewhere. ``solve(inputs)`` is the reference solver: it
reads the answer off the inputs alone (a sum, or a parse of the expression), written apart from the
generator so that a test can check that the labels mean what they say.

Layouts (``m`` = ``modulus``; the last input is the query token ``?``, where the xLSTM code puts its
padding token and reads the answer):

* :class:`Parity` (``parity.py``): ``n - 1`` uniform symbols ``0 .. m-1``, then ``?``; the answer is
  their sum modulo ``m``. ``m = 2`` is parity (the xLSTM code's ``vocab_size = m + 1``).
* :class:`ModularArithmetic` (``modular_arithmetic.py``): an expression of uniform numbers
  ``0 .. m-1`` and uniform operators ``+ - *`` in turn (numbers first and last), ``=``, ``?``; the
  answer is its value modulo ``m``, ``*`` before ``+`` and ``-``. The length ``n`` is odd, drawn
  as the xLSTM code draws it: ``2 k - 1`` with ``k`` uniform in
  ``[min((lo + 1) // 2, (hi + 1) // 2), (hi + 1) // 2]``. (``vocab_size = m + 5`` there.)
* :class:`ModularArithmeticBrackets` (``modular_arithmetic_with_brackets.py``): a fully bracketed
  expression of ``n - 3`` tokens, ``=``, ``?``, with ``n = max(uniform(lo, hi), 5)``. An expression
  of length 1 is a number, 2 ``-a``, 3 ``(a)``, 4 ``(-a)``; a longer one is ``(left op right)``
  with the left length uniform in ``[1, length - 4]`` and ``op`` uniform over ``+ - *`` (``+ -``
  with ``mult`` false). The xLSTM code ends each sequence with a padding token after the answer, which no
  causal model sees at the answer: it is left out, so inputs are ``n - 1`` long. (``vocab_size =
  m + 7`` there.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from longrange.data.batch import IGNORE_INDEX
from longrange.data.generate.base import Generator, check_bool, check_int
from longrange.data.generate.sequences import Example


@dataclass(frozen=True)
class StateTracking(Generator):
    """Base of the state-tracking generators: the training and held-out lengths, the modulus, the
    answer at the last position (see the module docstring)."""

    #: The shortest sequence any option allows (the layout needs it).
    SHORTEST: ClassVar[int] = 2
    #: The named tokens after the numbers, in order (the last is the query ``?``).
    SYMBOLS: ClassVar[tuple[str, ...]] = ("?",)

    modulus: int = 5
    min_len: int = 3
    max_len: int = 40
    eval_min_len: int = 40
    eval_max_len: int = 256

    def check(self) -> None:
        check_int(self.name, "modulus", self.modulus, 2, 1000)
        check_int(self.name, "min_len", self.min_len, self.SHORTEST)
        check_int(self.name, "max_len", self.max_len, self.min_len, why="at least min_len")
        check_int(self.name, "eval_min_len", self.eval_min_len, self.SHORTEST)
        check_int(self.name, "eval_max_len", self.eval_max_len, self.eval_min_len, why="at least eval_min_len")

    # ---- tokens
    @property
    def vocab_size(self) -> int:
        return self.modulus + len(self.SYMBOLS)

    def token(self, symbol: str) -> int:
        """The task token of a named symbol (``+``, ``=``, ``?``...)."""
        return self.modulus + self.SYMBOLS.index(symbol)

    @property
    def query(self) -> int:
        return self.token("?")

    def token_names(self) -> list[str]:
        """The name of every task token: the numbers, then the symbols."""
        return [str(t) for t in range(self.modulus)] + list(self.SYMBOLS)

    @property
    def answers(self) -> tuple[int, int]:
        """The tokens an answer can be, ``(first, last)``: the numbers."""
        return 0, self.modulus - 1

    @property
    def n_answers(self) -> int:
        return self.modulus

    # ---- lengths
    def lengths(self, training: bool) -> tuple[int, int]:
        """The range of the drawn length of the training split or of the held-out splits."""
        return (self.min_len, self.max_len) if training else (self.eval_min_len, self.eval_max_len)

    def input_length(self, n: int) -> int:
        """The length of the inputs of a drawn length ``n``."""
        return n

    @property
    def seq_len(self) -> int:
        """The longest input of any split."""
        return max(self.input_length(hi) for hi in (self.max_len, self.eval_max_len))

    def draw_length(self, rng: np.random.Generator, training: bool) -> int:
        lo, hi = self.lengths(training)
        return int(rng.integers(lo, hi + 1))

    # ---- examples
    def body(self, rng: np.random.Generator, n: int) -> tuple[list[int], int]:
        """The tokens before the query of a drawn length ``n``, and the answer."""
        raise NotImplementedError

    def draw(self, rng: np.random.Generator, training: bool = True) -> Example:
        tokens, answer = self.body(rng, self.draw_length(rng, training))
        inputs = np.asarray([*tokens, self.query], dtype=np.int64)
        targets = np.full(len(inputs), IGNORE_INDEX, dtype=np.int64)
        targets[-1] = answer
        return Example(inputs, targets)

    def solve(self, inputs: np.ndarray) -> int:
        """The answer asked at the last position, read off the inputs alone; a ValueError saying why
        when they do not have the task's layout."""
        tokens = [int(t) for t in np.asarray(inputs).reshape(-1)]
        if not tokens or tokens[-1] != self.query:
            raise ValueError(f"the last token must be the query token {self.query} ('?')")
        bad = [t for t in tokens if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"token {bad[0]} is outside the task's tokens 0 .. {self.vocab_size - 1}")
        return self.evaluate(tokens[:-1])

    def evaluate(self, tokens: list[int]) -> int:
        raise NotImplementedError


# ----------------------------------------------------------------------------------------- parity
@dataclass(frozen=True)
class Parity(StateTracking):
    """The sum of ``n - 1`` uniform symbols modulo ``modulus``; parity at ``modulus = 2``."""

    name: ClassVar[str] = "parity"

    modulus: int = 2

    def body(self, rng: np.random.Generator, n: int) -> tuple[list[int], int]:
        symbols = rng.integers(0, self.modulus, size=n - 1)
        return symbols.tolist(), int(symbols.sum() % self.modulus)

    def evaluate(self, tokens: list[int]) -> int:
        if any(t >= self.modulus for t in tokens):
            raise ValueError("only symbols may come before the query token")
        total = 0
        for t in tokens:
            total = (total + t) % self.modulus
        return total


# ------------------------------------------------------------------------------ modular arithmetic
class _Parser:
    """A recursive-descent reader of an arithmetic expression over task tokens: ``expr := term
    (('+' | '-') term)*``, ``term := factor ('*' factor)*``, ``factor := number | '-' factor | '('
    expr ')'``; its value modulo the modulus, or a ValueError naming the position at fault."""

    def __init__(self, gen: StateTracking, tokens: list[int]):
        self.gen, self.tokens, self.i = gen, tokens, 0
        self.names = gen.token_names()

    def peek(self) -> str | None:
        return self.names[self.tokens[self.i]] if self.i < len(self.tokens) else None

    def take(self, *allowed: str) -> str:
        name = self.peek()
        if name is None or (allowed and name not in allowed):
            want = " or ".join(repr(a) for a in allowed) if allowed else "a token"
            raise ValueError(f"position {self.i}: expected {want}, found {name!r}")
        self.i += 1
        return name

    def parse(self) -> int:
        value = self.expr()
        if self.i != len(self.tokens) - 1 or self.peek() != "=":
            raise ValueError(f"position {self.i}: expected '=' ending the expression, found {self.peek()!r}")
        return value % self.gen.modulus

    def expr(self) -> int:
        value = self.term()
        while self.peek() in ("+", "-"):
            value = value + self.term() if self.take() == "+" else value - self.term()
        return value

    def term(self) -> int:
        value = self.factor()
        while self.peek() == "*":
            self.take()
            value *= self.factor()
        return value

    def factor(self) -> int:
        name = self.peek()
        if name == "-" and "(" in self.names:  # unary minus: the bracketed task's only
            self.take()
            return -self.factor()
        if name == "(":
            self.take()
            value = self.expr()
            self.take(")")
            return value
        if name is not None and name.isdigit():
            self.take()
            return int(name)
        raise ValueError(f"position {self.i}: expected a number, found {name!r}")


@dataclass(frozen=True)
class ModularArithmetic(StateTracking):
    """The value modulo ``modulus`` of ``a op b op ... c`` with ``op`` in ``+ - *``."""

    name: ClassVar[str] = "modular-arithmetic"
    SHORTEST: ClassVar[int] = 3
    SYMBOLS: ClassVar[tuple[str, ...]] = ("+", "-", "*", "=", "?")

    def draw_length(self, rng: np.random.Generator, training: bool) -> int:
        lo, hi = self.lengths(training)
        top = (hi + 1) // 2
        return 2 * int(rng.integers(min((lo + 1) // 2, top), top + 1)) - 1

    def input_length(self, n: int) -> int:
        return n if n % 2 else n - 1  # the longest odd length

    def body(self, rng: np.random.Generator, n: int) -> tuple[list[int], int]:
        n_numbers = (n - 1) // 2
        numbers = rng.integers(0, self.modulus, size=n_numbers)
        ops = rng.integers(0, 3, size=n_numbers - 1)
        tokens = [int(numbers[0])]
        total, term, sign = 0, int(numbers[0]), 1
        for op, number in zip(ops, numbers[1:]):
            tokens += [self.modulus + int(op), int(number)]
            if op == 2:  # '*'
                term *= int(number)
            else:
                total += sign * term
                term, sign = int(number), (1 if op == 0 else -1)
        total += sign * term
        return [*tokens, self.token("=")], total % self.modulus

    def evaluate(self, tokens: list[int]) -> int:
        return _Parser(self, tokens).parse()


@dataclass(frozen=True)
class ModularArithmeticBrackets(StateTracking):
    """The value modulo ``modulus`` of a fully bracketed expression of ``+ -`` (and ``*``)."""

    name: ClassVar[str] = "modular-arithmetic-brackets"
    SHORTEST: ClassVar[int] = 1
    SYMBOLS: ClassVar[tuple[str, ...]] = ("+", "-", "*", "(", ")", "=", "?")

    mult: bool = True

    def check(self) -> None:
        super().check()
        check_bool(self.name, "mult", self.mult)

    def draw_length(self, rng: np.random.Generator, training: bool) -> int:
        return max(super().draw_length(rng, training), 5)

    def input_length(self, n: int) -> int:
        return max(n, 5) - 1

    def expression(self, rng: np.random.Generator, length: int) -> tuple[list[int], int]:
        """A bracketed expression of exactly ``length`` tokens and its value modulo the modulus."""
        m, tok = self.modulus, self.token
        if length < 5:
            a = int(rng.integers(m))
            return {
                1: ([a], a),
                2: ([tok("-"), a], -a % m),
                3: ([tok("("), a, tok(")")], a),
                4: ([tok("("), tok("-"), a, tok(")")], -a % m),
            }[length]
        left_length = int(rng.integers(1, length - 3))
        left, lv = self.expression(rng, left_length)
        right, rv = self.expression(rng, length - left_length - 3)
        op = int(rng.integers(0, 3 if self.mult else 2))
        value = (lv + rv, lv - rv, lv * rv)[op] % m
        return [tok("("), *left, m + op, *right, tok(")")], value

    def body(self, rng: np.random.Generator, n: int) -> tuple[list[int], int]:
        tokens, value = self.expression(rng, n - 3)
        return [*tokens, self.token("=")], value

    def evaluate(self, tokens: list[int]) -> int:
        if not self.mult and self.token("*") in tokens:
            raise ValueError("'*' appears, but the task's option mult is false")
        return _Parser(self, tokens).parse()


#: The state-tracking generators, by task name.
STATE_TRACKING: dict[str, type[StateTracking]] = {
    cls.name: cls for cls in (Parity, ModularArithmetic, ModularArithmeticBrackets)
}
