"""The shape every synthetic generator shares.

A generator is a frozen dataclass of its options, checked when it is built (an option outside its
range is a :class:`~longrange.errors.ConfigError` naming the generator, the option, its valid range
and the value), with :meth:`Generator.draw`: one example from one random stream. The stream decides
everything, so an example is a pure function of the options and the stream's seed.

    scenes = SceneParams(resolution=32)                  # Pathfinder: draw(rng, label) -> Scene
    trees = ListOpsTrees(min_length=50, max_length=256)  # ListOps: draw(rng) -> (tree, length) or None
    copying = SelectiveCopying(seq_len=256)              # draw(rng) -> Example

The sequence tasks (selective copying, induction heads, associative recall) draw each example from
``example_rng(seed, task, split, epoch, index)``: any split, process or data-loader worker builds
the same example for the same key, whatever it built before.
"""

from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from longrange.errors import ConfigError


def option_range(low: float | None, high: float | None, integer: bool) -> str:
    """``an integer in [1, 8]``, ``an integer >= 1``, ``a number > 0``..."""
    kind = "an integer" if integer else "a number"
    if low is not None and high is not None:
        return f"{kind} in [{low}, {high}]"
    if low is not None:
        return f"{kind} >= {low}"
    return f"{kind} <= {high}" if high is not None else kind


def check_int(owner: str, name: str, value: Any, low: int | None = None, high: int | None = None, why: str = "") -> int:
    """``value`` as an int, or a ConfigError naming ``owner``'s option ``name``, its range and ``why``."""
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    if ok and (low is None or value >= low) and (high is None or value <= high):
        return int(value)
    raise ConfigError(
        f"{owner} option {name} must be {option_range(low, high, True)}{f' ({why})' if why else ''}, got {value!r}"
    )


def check_positive(owner: str, name: str, value: Any, why: str = "") -> float:
    """``value`` as a float > 0, or a ConfigError naming ``owner``'s option ``name``."""
    ok = isinstance(value, (int, float, np.floating)) and not isinstance(value, bool)
    if ok and np.isfinite(value) and value > 0:
        return float(value)
    raise ConfigError(f"{owner} option {name} must be a finite number > 0{f' ({why})' if why else ''}, got {value!r}")


def check_bool(owner: str, name: str, value: Any) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ConfigError(f"{owner} option {name} must be true or false, got {value!r}")


def stream_code(name: str) -> int:
    """A stable integer for a name (a part of every example's seed, so tasks draw apart)."""
    return zlib.crc32(name.encode("utf-8"))


def example_rng(seed: int, *key: int) -> np.random.Generator:
    """The random stream of one example: ``numpy.random.default_rng([seed, *key])``."""
    return np.random.default_rng([int(seed), *(int(k) for k in key)])


@dataclass(frozen=True)
class Generator:
    """Base of the generators: options as dataclass fields, checked by :meth:`check` when built."""

    #: The generator's name, in its option errors (the task's name for the sequence tasks).
    name: ClassVar[str] = "generator"

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """A ConfigError for an option outside its range (the base accepts everything)."""

    def draw(self, rng: Any, *args: Any) -> Any:
        """One example from the random stream ``rng``."""
        raise NotImplementedError

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """The options with their default values, in declaration order."""
        return {f.name: f.default for f in dataclasses.fields(cls) if f.init}

    def options(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
