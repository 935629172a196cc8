"""Generators of MAD's synthetic tasks (Poli et al. 2024, "Mechanistic Design and Scaling of Hybrid
Architectures", arXiv 2403.17844; athms/mad-lab ``mad/data/instances.py``).

Each generator draws one example in *task tokens* ``0 .. vocab_size - 1`` from one random stream,
as the toolkit's other sequence generators (:mod:`longrange.data.generate.base`):
``draw(rng, training, seed)``, where ``training`` picks mad-lab's training form of an instance
(``is_training=True``) and ``seed`` is the data seed, which only memorization reads (its fixed
key-value map). Targets hold the answer at each position that asks one and
:data:`~longrange.data.batch.IGNORE_INDEX` elsewhere, as mad-lab's (whose loss and accuracy ignore
-100). ``solve(inputs, seed)`` is the reference solver: the positions asked and their answers, read
off the inputs alone (memorization: off its key-value map).

Layouts (``V`` = ``vocab_size``, ``L`` = ``seq_len``; docs/data.md has the settings and levels):

* :class:`InContextRecall` (``generate_in_context_recall_instance``), with noise
  :class:`NoisyInContextRecall`: ``S = V - noise_vocab_size`` symbols (``V - 1 - noise_vocab_size``
  without ``multi_query``, whose copy prefix is ``V - 1``), keys ``0 .. S//2 - 1``, values
  ``S//2 .. S - 1``, noise ``S .. S + noise_vocab_size - 1``. ``L/2 - 1`` pairs: with probability
  ``frac_noise`` two uniform noise tokens (one random pair is always a key-value pair), else a
  uniform key and its value (uniform, drawn at the key's first occurrence, kept after); then (the copy prefix without
  ``multi_query``) a key already shown and its value. The sequence is shifted by one, mad-lab's
  ``inputs[:-1]``: input ``t`` predicts token ``t + 1``. The answers are the values of keys shown
  before, at the key's position (``multi_query``), or the final value alone; the training form's
  targets are every next token (``train_targets="next-token"``, mad-lab's) or the answers alone.
* :class:`FuzzyInContextRecall` (``generate_fuzzy_in_context_recall_instance``): keys and values
  are motifs, tuples of 1 .. ``k_motif_size`` (values: 1 .. ``v_motif_size``) distinct tokens (the
  size uniform, then the tuple uniform); the pad ``V - 1`` (``V - 2`` without ``multi_query``), keys
  ``0 .. S//2 - 1``, values ``S//2 .. S - 1`` of ``S = V - 1`` (``V - 2``) symbols. A probe pair
  sits at a random position among the pairs (or in place of a pair that would end the sequence
  without it: mad-lab then leaves it out), the probe key ends the sequence; padded at the front
  to ``L + 1`` and shifted. Held-out splits draw every key at ``k_motif_size``. The answers are the
  tokens of the value of a key shown before, each at the position before it.
* :class:`SelectiveCopying` (``generate_copying_instance(selective=True)``): data ``0 .. V-3``,
  blank ``V-2``, copy token ``V-1``. ``n_tokens`` uniform data tokens with ``L - 2 n_tokens - 1``
  blanks inserted before uniform indices of them (never after the last), the copy token, then
  ``n_tokens`` blanks, at which the answers are the data tokens in order.
* :class:`Memorization` (``generate_memorization_instance``, ``generate_kv_map``): insert token
  ``V - 1``; a fixed map of keys ``0 .. S//2 - 1`` onto values ``S//2 .. S - 1`` (``S = V - 1``),
  mad-lab's: ``numpy.random.default_rng(seed)`` shuffles the keys, then the values, and pairs them
  in order. ``L/2`` pairs of a uniform key and the insert token, the answer at the insert token
  being the key's value.
* :class:`Compression` (``generate_compression_instance``): ``L - 1`` uniform tokens
  ``0 .. V-2`` and the compression token ``V - 1``; the target at every position is its input token
  (mad-lab reconstructs them through an autoencoder that reads the last position only).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from longrange.data.batch import IGNORE_INDEX
from longrange.data.generate.base import Generator, check_bool, check_int
from longrange.data.generate.sequences import Example
from longrange.errors import ConfigError

#: The training form of the recall tasks' targets: mad-lab's every next token, or the answers alone.
TRAIN_TARGETS = ("next-token", "answers")


def check_fraction(owner: str, name: str, value: Any) -> float:
    """``value`` as a float in [0, 1), or a ConfigError naming ``owner``'s option ``name``."""
    ok = isinstance(value, (int, float, np.floating)) and not isinstance(value, bool)
    if ok and 0.0 <= value < 1.0:
        return float(value)
    raise ConfigError(f"{owner} option {name} must be a number in [0, 1), got {value!r}")


def check_choice(owner: str, name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value in choices:
        return str(value)
    raise ConfigError(f"{owner} option {name} must be one of {', '.join(repr(c) for c in choices)}, got {value!r}")


def _permutation(u: np.ndarray, size: int, n: int, first: int) -> tuple[int, ...]:
    """``size`` distinct tokens of ``first .. first + n - 1`` in a uniform order, from ``size`` uniform
    numbers ``u`` in [0, 1): the j-th pick is uniform among the ``n - j`` tokens left (a uniform
    draw of mad-lab's ``permutations(vocab, size)``)."""
    picked: list[int] = []
    for j in range(size):
        r = int(u[j] * (n - j))
        for p in sorted(picked):  # skip the tokens already picked
            if r >= p:
                r += 1
        picked.append(r)
    return tuple(first + p for p in picked)


@dataclass(frozen=True)
class MADGenerator(Generator):
    """Base of MAD's generators: options checked when built, ``draw``, ``asked`` and ``solve``."""

    #: The targets are next-token predictions (the model must be causal).
    causal: ClassVar[bool] = False

    @property
    def length(self) -> int:
        """The length of every input."""
        raise NotImplementedError

    @property
    def answers(self) -> tuple[int, int]:
        """The tokens an answer can be, ``(first, last)``."""
        raise NotImplementedError

    @property
    def n_answers(self) -> int:
        """The number of possible answers: chance is one over it."""
        first, last = self.answers
        return last - first + 1

    def draw(self, rng: np.random.Generator, training: bool = True, seed: int = 0) -> Example:
        raise NotImplementedError

    def asked(self, inputs: np.ndarray) -> np.ndarray:
        """The positions an input asks at (its held-out form), from the inputs alone; a ValueError
        saying why when the inputs do not have the task's layout."""
        return self.solve(inputs)[0]

    def solve(self, inputs: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """The reference solver: (positions asked, answers) from the inputs alone."""
        raise NotImplementedError


# ------------------------------------------------------------------------------ in-context recall
@dataclass(frozen=True)
class InContextRecall(MADGenerator):
    """MAD's in-context recall (module docstring): recall the value of each key shown before."""

    name: ClassVar[str] = "mad-in-context-recall"
    causal: ClassVar[bool] = True

    vocab_size: int = 16
    seq_len: int = 128
    multi_query: bool = True
    noise_vocab_size: int = 0
    frac_noise: float = 0.0
    train_targets: str = "next-token"

    @property
    def n_symbols(self) -> int:
        """Keys and values: the vocabulary without the copy prefix (single query) and the noise."""
        return self.vocab_size - (0 if self.multi_query else 1) - self.noise_vocab_size

    @property
    def first_value(self) -> int:
        return self.n_symbols // 2

    @property
    def copy_prefix(self) -> int:
        return self.vocab_size - 1

    @property
    def length(self) -> int:
        return self.seq_len - 1 if self.multi_query else self.seq_len

    @property
    def answers(self) -> tuple[int, int]:
        return self.first_value, self.n_symbols - 1

    def check(self) -> None:
        check_bool(self.name, "multi_query", self.multi_query)
        noise = check_int(self.name, "noise_vocab_size", self.noise_vocab_size, 0)
        special = 0 if self.multi_query else 1
        check_int(
            self.name,
            "vocab_size",
            self.vocab_size,
            2 + noise + special,
            why=f"at least one key and one value besides {noise} noise tokens"
            f"{'' if self.multi_query else ' and the copy prefix'}",
        )
        check_int(
            self.name, "seq_len", self.seq_len, 4, why="an even length: key-value pairs, at least one before the query"
        )
        if self.seq_len % 2:
            raise ConfigError(f"{self.name} option seq_len must be even (key-value pairs), got {self.seq_len}")
        frac = check_fraction(self.name, "frac_noise", self.frac_noise)
        if frac > 0 and noise == 0:
            raise ConfigError(
                f"{self.name} option frac_noise={self.frac_noise} needs noise tokens: set noise_vocab_size >= 1"
            )
        check_choice(self.name, "train_targets", self.train_targets, TRAIN_TARGETS)

    def draw(self, rng: np.random.Generator, training: bool = True, seed: int = 0) -> Example:
        n_pairs = self.seq_len // 2 - 1  # the pairs before the query
        S, first = self.n_symbols, self.first_value
        keys = rng.integers(0, first, size=n_pairs)
        table = rng.integers(first, S, size=first)  # each key's value, fixed at its first occurrence
        pairs = np.stack([keys, table[keys]], axis=1)
        noise = np.zeros(n_pairs, dtype=bool)
        if self.frac_noise > 0:
            noise = rng.random(n_pairs) < self.frac_noise
            noise[rng.integers(n_pairs)] = False  # at least one key-value pair
            pairs[noise] = rng.integers(S, S + self.noise_vocab_size, size=(int(noise.sum()), 2))
        shown = keys[~noise]
        _, first_at = np.unique(shown, return_index=True)
        repeated = np.ones(len(shown), dtype=bool)
        repeated[first_at] = False  # a key shown before: its value is asked (multi_query)
        probe = int(rng.choice(np.unique(shown)))
        tail = [probe, int(table[probe])] if self.multi_query else [self.copy_prefix, probe, int(table[probe])]
        full = np.concatenate([pairs.reshape(-1), tail]).astype(np.int64)
        values_asked = np.zeros(len(full), dtype=bool)  # the value tokens whose keys were shown before
        if self.multi_query:
            values_asked[2 * np.flatnonzero(~noise)[repeated] + 1] = True
        values_asked[-1] = True
        inputs = full[:-1]
        held_out = np.where(values_asked, full, IGNORE_INDEX)[1:]
        targets = full[1:].copy() if training and self.train_targets == "next-token" else held_out
        recalled = np.zeros(len(full), dtype=bool)
        recalled[2 * np.flatnonzero(~noise)[repeated] + 1] = True
        return Example(inputs, targets, recalled=recalled[:-1])

    def solve(self, inputs: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Walk the pairs: remember each key's first value; ask at a key shown before (every such
        key with ``multi_query``, else the key after the copy prefix at the end)."""
        x = np.asarray(inputs)
        first, S = self.first_value, self.n_symbols
        seen: dict[int, int] = {}
        asked, answers = [], []
        end = len(x) if self.multi_query else len(x) - 2
        for i in range(0, end, 2):
            key = int(x[i])
            if key >= S:  # two noise tokens
                continue
            if key >= first:
                raise ValueError(f"position {i}: {key} is not a key (0..{first - 1}) or noise")
            if key in seen:
                if self.multi_query:
                    asked.append(i)
                    answers.append(seen[key])
            elif i + 1 < len(x):
                seen[key] = int(x[i + 1])
        if not self.multi_query:
            if len(x) < 4 or x[-2] != self.copy_prefix:
                raise ValueError(
                    f"the input does not end in the copy prefix {self.copy_prefix} and a query key after "
                    "key-value pairs"
                )
            key = int(x[-1])
            if key not in seen:
                raise ValueError(f"the query {key} at the last position is not a key shown before")
            asked.append(len(x) - 1)
            answers.append(seen[key])
        if not asked:
            raise ValueError("no key is shown twice: the input asks nothing")
        return np.array(asked, dtype=np.int64), np.array(answers, dtype=np.int64)


@dataclass(frozen=True)
class NoisyInContextRecall(InContextRecall):
    """MAD's noisy in-context recall: in-context recall with pairs of noise tokens among the pairs."""

    name: ClassVar[str] = "mad-noisy-recall"

    vocab_size: int = 32
    noise_vocab_size: int = 16
    frac_noise: float = 0.2


# ------------------------------------------------------------------------ fuzzy in-context recall
@dataclass(frozen=True)
class FuzzyInContextRecall(MADGenerator):
    """MAD's fuzzy in-context recall: keys and values of several tokens (module docstring)."""

    name: ClassVar[str] = "mad-fuzzy-recall"
    causal: ClassVar[bool] = True

    vocab_size: int = 16
    seq_len: int = 128
    k_motif_size: int = 3
    v_motif_size: int = 3
    multi_query: bool = True
    train_targets: str = "next-token"

    @property
    def n_symbols(self) -> int:
        return self.vocab_size - (1 if self.multi_query else 2)

    @property
    def first_value(self) -> int:
        return self.n_symbols // 2

    @property
    def pad(self) -> int:
        return self.vocab_size - (1 if self.multi_query else 2)

    @property
    def copy_prefix(self) -> int:
        return self.vocab_size - 1

    @property
    def length(self) -> int:
        return self.seq_len

    @property
    def answers(self) -> tuple[int, int]:
        return self.first_value, self.n_symbols - 1

    def check(self) -> None:
        check_bool(self.name, "multi_query", self.multi_query)
        K = check_int(self.name, "k_motif_size", self.k_motif_size, 1)
        W = check_int(self.name, "v_motif_size", self.v_motif_size, 1)
        special = 1 if self.multi_query else 2
        check_int(
            self.name,
            "vocab_size",
            self.vocab_size,
            special + max(2 * K, 2 * W - 1),
            why=f"{K} distinct key tokens in the lower half of the vocabulary, {W} distinct value tokens in "
            f"the rest, and {'the pad' if self.multi_query else 'the pad and the copy prefix'}",
        )
        check_int(
            self.name,
            "seq_len",
            self.seq_len,
            2 * (K + W) + 1,
            why=f"a probe pair of up to {K + W} tokens twice, the room mad-lab's generator keeps for it",
        )
        check_choice(self.name, "train_targets", self.train_targets, TRAIN_TARGETS)

    def draw(self, rng: np.random.Generator, training: bool = True, seed: int = 0) -> Example:
        L, K, W = self.seq_len, self.k_motif_size, self.v_motif_size
        first, S = self.first_value, self.n_symbols
        n_keys, n_values = first, S - first

        def key(size: int) -> tuple[int, ...]:
            return _permutation(rng.random(size), size, n_keys, 0)

        def value(size: int) -> tuple[int, ...]:
            return _permutation(rng.random(size), size, n_values, first)

        def key_size() -> int:
            return int(rng.integers(1, K + 1)) if training else K

        probe_key = key(key_size())
        probe_value = value(int(rng.integers(1, W + 1)))
        probe_size = len(probe_key) + len(probe_value)
        probe_at = int(rng.integers(L - 2 * probe_size))
        stop = L - probe_size - (K + W)
        tokens: list[int] = []
        recall: list[bool] = []  # the value tokens of keys shown before
        table: dict[tuple[int, ...], tuple[int, ...]] = {}
        probe_added = False
        while len(tokens) < stop:
            k_size, v_size = key_size(), int(rng.integers(1, W + 1))
            if not probe_added and len(tokens) >= probe_at:  # the probe pair at its position
                tokens += probe_key + probe_value
                recall += [False] * probe_size
                table[probe_key] = probe_value
                probe_added = True
                continue
            k = key(k_size)
            if k == probe_key:
                v, probe_added = probe_value, True
            elif k in table:
                v = table[k]
            else:
                v = value(v_size)
            if not probe_added and len(tokens) + len(k) + len(v) >= stop:
                # this pair would end the sequence without the probe pair, whose key ends it: the probe
                # pair instead (mad-lab leaves it out, and its query's value cannot be recalled)
                tokens += probe_key + probe_value
                recall += [False] * probe_size
                table[probe_key] = probe_value
                probe_added = True
                continue
            recall += [False] * len(k) + [k in table] * len(v)
            table[k] = v
            tokens += k + v
        tail = probe_key + probe_value if self.multi_query else (self.copy_prefix,) + probe_key + probe_value
        n_pad = L + 1 - len(tokens) - len(tail)
        full = np.array([self.pad] * n_pad + tokens + list(tail), dtype=np.int64)
        final = [False] * (len(tail) - len(probe_value)) + [True] * len(probe_value)  # the query's value
        recalled = np.array([False] * n_pad + recall + final)
        answered = np.array([False] * n_pad + [r and self.multi_query for r in recall] + final)
        held_out = np.where(answered, full, IGNORE_INDEX)[1:]
        targets = full[1:].copy() if training and self.train_targets == "next-token" else held_out
        return Example(full[:-1], targets, recalled=recalled[:-1])

    def _pairs(self, x: np.ndarray) -> list[tuple[int, int, tuple[int, ...], int]]:
        """The key runs of ``x``: ``(start, end, key, end of the value run after it)``."""
        first = self.first_value
        out, i, n = [], 0, len(x)
        while i < n:
            if x[i] < first:
                start = i
                while i < n and x[i] < first:
                    i += 1
                end = i
                while i < n and first <= x[i] < self.n_symbols:
                    i += 1
                out.append((start, end, tuple(int(t) for t in x[start:end]), i))
            else:
                i += 1
        return out

    def solve(self, inputs: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Split the input into runs of key tokens and of value tokens (a key is the run of key
        tokens before a run of value tokens); remember each key's value; ask, from the last token of
        a key shown before (every such key with ``multi_query``, else the key after the copy
        prefix), one position per token of its value."""
        x = np.asarray(inputs)
        seen: dict[tuple[int, ...], tuple[int, ...]] = {}
        asked: list[int] = []
        answers: list[int] = []
        pairs = self._pairs(x)
        for n, (start, end, key, value_end) in enumerate(pairs):
            last = n == len(pairs) - 1
            if key in seen:
                if self.multi_query or (last and start > 0 and x[start - 1] == self.copy_prefix):
                    value = seen[key]
                    asked += range(end - 1, end - 1 + len(value))
                    answers += value
            elif not last:
                seen[key] = tuple(int(t) for t in x[end:value_end])
        if not self.multi_query and not asked:
            raise ValueError(f"no key shown before follows the copy prefix {self.copy_prefix} at the end")
        if not asked:
            raise ValueError("no key is shown twice: the input asks nothing")
        if asked[-1] >= len(x):
            raise ValueError("the last key's value runs past the end of the input")
        return np.array(asked, dtype=np.int64), np.array(answers, dtype=np.int64)


# ----------------------------------------------------------------------------- selective copying
@dataclass(frozen=True)
class SelectiveCopying(MADGenerator):
    """MAD's selective copying: the data tokens among blanks, in order, after the copy token."""

    name: ClassVar[str] = "mad-selective-copying"

    vocab_size: int = 16
    seq_len: int = 256
    n_tokens: int = 16

    @property
    def blank(self) -> int:
        return self.vocab_size - 2

    @property
    def copy_token(self) -> int:
        return self.vocab_size - 1

    @property
    def length(self) -> int:
        return self.seq_len

    @property
    def answers(self) -> tuple[int, int]:
        return 0, self.vocab_size - 3

    def check(self) -> None:
        check_int(
            self.name, "vocab_size", self.vocab_size, 3, why="the blank, the copy token and at least one data token"
        )
        n = check_int(self.name, "n_tokens", self.n_tokens, 1)
        check_int(
            self.name,
            "seq_len",
            self.seq_len,
            2 * n + 2,
            why=f"{n} data tokens, at least one blank, the copy token and {n} blanks after it",
        )

    def draw(self, rng: np.random.Generator, training: bool = True, seed: int = 0) -> Example:
        n, L = self.n_tokens, self.seq_len
        data = rng.integers(0, self.vocab_size - 2, size=n)
        before = rng.integers(0, n, size=L - 2 * n - 1)  # each blank goes before a uniform data token
        body = np.insert(data, before, self.blank)
        inputs = np.concatenate([body, [self.copy_token], np.full(n, self.blank)]).astype(np.int64)
        targets = np.full(L, IGNORE_INDEX, dtype=np.int64)
        targets[L - n :] = data
        return Example(inputs, targets)

    def solve(self, inputs: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """The positions after the copy token, and the data tokens before it, in order."""
        x = np.asarray(inputs)
        marks = np.flatnonzero(x == self.copy_token)
        if len(marks) != 1:
            raise ValueError(f"{len(marks)} copy tokens ({self.copy_token}); the input has one, before the answers")
        at = int(marks[0])
        data = x[:at][x[:at] != self.blank]
        asked = np.arange(at + 1, len(x))
        if len(asked) != len(data):
            raise ValueError(f"{len(data)} data tokens before the copy token but {len(asked)} positions after it")
        return asked, data.astype(np.int64)


# --------------------------------------------------------------------------------- memorization
@functools.lru_cache(maxsize=16)
def _key_values(n_symbols: int, seed: int) -> np.ndarray:
    """``default_rng(seed)`` shuffles the keys ``0 .. S//2 - 1``, then the values ``S//2 .. S - 1``;
    the i-th key maps to the i-th value. Read-only: one array is shared by every caller."""
    rng = np.random.default_rng(seed)
    keys, values = np.arange(n_symbols // 2), np.arange(n_symbols // 2, n_symbols)
    rng.shuffle(keys)
    rng.shuffle(values)
    out = np.empty(n_symbols // 2, dtype=np.int64)
    out[keys] = values[: len(keys)]
    out.flags.writeable = False
    return out


@dataclass(frozen=True)
class Memorization(MADGenerator):
    """MAD's memorization: the value of each key under a map fixed by the data seed."""

    name: ClassVar[str] = "mad-memorization"

    vocab_size: int = 256
    seq_len: int = 32

    @property
    def insert(self) -> int:
        return self.vocab_size - 1

    @property
    def first_value(self) -> int:
        return (self.vocab_size - 1) // 2

    @property
    def length(self) -> int:
        return self.seq_len

    @property
    def answers(self) -> tuple[int, int]:
        return self.first_value, self.vocab_size - 2

    @property
    def n_answers(self) -> int:
        """The values the map uses: one per key (an odd number of symbols leaves one value out)."""
        return self.first_value

    def check(self) -> None:
        check_int(self.name, "vocab_size", self.vocab_size, 3, why="the insert token, at least one key and one value")
        check_int(self.name, "seq_len", self.seq_len, 2, why="an even length: pairs of a key and the insert token")
        if self.seq_len % 2:
            raise ConfigError(
                f"{self.name} option seq_len must be even (pairs of a key and the insert token), got {self.seq_len}"
            )

    def table(self, seed: int) -> np.ndarray:
        """The value of each key ``0 .. S//2 - 1`` under the map of data seed ``seed`` (mad-lab's
        ``generate_kv_map(vocab_size - 1, seed=seed)``: its map at seed 12345, mad-lab's seed)."""
        return _key_values(self.vocab_size - 1, int(seed))

    def draw(self, rng: np.random.Generator, training: bool = True, seed: int = 0) -> Example:
        table = self.table(seed)
        keys = rng.integers(0, len(table), size=self.seq_len // 2)
        inputs = np.stack([keys, np.full_like(keys, self.insert)], axis=1).reshape(-1)
        targets = np.stack([np.full_like(keys, IGNORE_INDEX), table[keys]], axis=1).reshape(-1)
        return Example(inputs.astype(np.int64), targets.astype(np.int64))

    def asked(self, inputs: np.ndarray) -> np.ndarray:
        x = np.asarray(inputs)
        asked = np.flatnonzero(x == self.insert)
        if not len(asked):
            raise ValueError(f"no insert token ({self.insert}): memorization asks at each insert token after a key")
        bad = [int(i) for i in asked if i == 0 or not 0 <= x[i - 1] < self.first_value]
        if bad:
            raise ValueError(f"position {bad[0]}: the insert token does not follow a key (0..{self.first_value - 1})")
        return asked

    def solve(self, inputs: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """The insert tokens, and the map's value of the key before each."""
        asked = self.asked(inputs)
        return asked, self.table(seed)[np.asarray(inputs)[asked - 1]]


# ---------------------------------------------------------------------------------- compression
@dataclass(frozen=True)
class Compression(MADGenerator):
    """MAD's compression: every input token is its own target (module docstring), answered from the
    last position alone (:attr:`head`: mad-lab scores it through an autoencoder that decodes every
    token from the last position; a head at every position would copy its input)."""

    name: ClassVar[str] = "mad-compression"
    #: The supervised head the task needs (:class:`~longrange.models.heads.LastPositionDecoder`).
    head: ClassVar[str] = "decode-last"

    vocab_size: int = 16
    seq_len: int = 32

    @property
    def compression_token(self) -> int:
        return self.vocab_size - 1

    @property
    def length(self) -> int:
        return self.seq_len

    @property
    def answers(self) -> tuple[int, int]:
        return 0, self.vocab_size - 1

    def check(self) -> None:
        check_int(self.name, "vocab_size", self.vocab_size, 2, why="the compression token and at least one data token")
        check_int(self.name, "seq_len", self.seq_len, 2, why="at least one token and the compression token")

    def draw(self, rng: np.random.Generator, training: bool = True, seed: int = 0) -> Example:
        inputs = np.append(rng.integers(0, self.vocab_size - 1, size=self.seq_len - 1), self.compression_token)
        return Example(inputs.astype(np.int64), inputs.astype(np.int64))

    def solve(self, inputs: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        x = np.asarray(inputs)
        if len(x) != self.length or x[-1] != self.compression_token:
            raise ValueError(f"expected {self.length} tokens ending in the compression token {self.compression_token}")
        return np.arange(len(x)), x.astype(np.int64)

    def asked(self, inputs: np.ndarray) -> np.ndarray:
        return self.solve(inputs)[0]
