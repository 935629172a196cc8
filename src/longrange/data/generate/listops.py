"""The ListOps generator of the Long Range Arena, seeded and writing the LRA file format.

Sampling (as in LRA's ``lra_benchmarks/data/listops.py``): starting at depth 1, a node below
``max_depth`` becomes an operator with probability 0.25 (else, and always at ``max_depth``, a value
0-9). An operator node draws 2..``max_args`` arguments, each a node one level deeper, then its
operator among MIN, MAX, MED (median rounded down: ``int(numpy.median)``), SM (sum modulo 10). A
tree's *length* counts its values plus 2 per operator (the operator and its closing bracket), i.e.
its number of tokens. Trees with ``min_length < length < max_length`` are kept; duplicates are
dropped over all splits together (one pool, as LRA does), so no source occurs twice in a split or in
two splits. The first ``n_train`` distinct trees form the training split, then validation, then test.

Speed: a tree is abandoned as soon as its running length reaches ``max_length``. The kept trees have
exactly the distribution of LRA's rejection sampling (a tree abandoned early would have been
rejected anyway), but short windows (e.g. lengths 64-256) no longer pay for building huge trees.

Output (LRA format, byte for byte for a given seed): ``basic_{train,val,test}.tsv``, tab-separated,
header ``Source<TAB>Target``, CRLF line endings (LRA writes with Python's default ``csv`` dialect),
sources fully parenthesised, e.g. ``( ( ( [MAX 4 ) 5 ) ] )`` for MAX(4, 5).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from longrange.data.generate.base import Generator, check_int
from longrange.data.listops import CLOSE, OPERATORS, SPLITS
from longrange.data.progress import progress_bar
from longrange.errors import ConfigError

#: Probability that a node below the maximum depth is an operator (LRA's ``VALUE_P``).
OPERATOR_PROB = 0.25
#: Attempts without a new distinct sample after which the window is declared exhausted.
MAX_STALL = 1_000_000

Tree = int | tuple  # a value, or (operator, [argument trees])

DEFAULTS = dict(
    n_train=96000, n_val=2000, n_test=2000, min_length=500, max_length=2000, max_depth=10, max_args=10, seed=0
)


class _TooLong(Exception):
    pass


def _sample_tree(rng: random.Random, depth: int, max_depth: int, max_args: int, used: list[int], limit: int) -> Tree:
    """One random tree; raises _TooLong once its running length ``used[0]`` exceeds ``limit``."""
    r = rng.random() if depth < max_depth else 1.0
    if r > OPERATOR_PROB:
        used[0] += 1
        if used[0] > limit:
            raise _TooLong
        return rng.randrange(10)
    used[0] += 2
    if used[0] > limit:
        raise _TooLong
    n_args = rng.randint(2, max_args)
    args = [_sample_tree(rng, depth + 1, max_depth, max_args, used, limit) for _ in range(n_args)]
    return (OPERATORS[rng.randrange(len(OPERATORS))], args)


def sample_tree(
    rng: random.Random, max_depth: int = 10, max_args: int = 10, max_length: int | None = None
) -> tuple[Tree, int] | None:
    """A tree and its length, or None if its length would reach ``max_length``."""
    used = [0]
    limit = (max_length - 1) if max_length is not None else float("inf")
    try:
        tree = _sample_tree(rng, 1, max_depth, max_args, used, limit)
    except _TooLong:
        return None
    return tree, used[0]


def to_source(tree: Tree) -> str:
    """LRA's fully parenthesised form: ``[OP a b c ]`` is written ``( ( ( ( [OP a ) b ) c ) ] )``."""
    if isinstance(tree, int):
        return str(tree)
    op, args = tree
    parts = ["( " * (len(args) + 1), op, " ", to_source(args[0]), " )"]
    for arg in args[1:]:
        parts += [" ", to_source(arg), " )"]
    parts.append(f" {CLOSE} )")
    return "".join(parts)


def evaluate(tree: Tree) -> int:
    """The value 0-9 of a tree."""
    if isinstance(tree, int):
        return tree
    op, args = tree
    values = [evaluate(a) for a in args]
    if op == "[MIN":
        return min(values)
    if op == "[MAX":
        return max(values)
    if op == "[SM":
        return sum(values) % 10
    if op == "[MED":
        values.sort()
        mid = len(values) // 2
        # numpy's median averages the two middle values of an even count; int() then rounds down
        return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) // 2
    raise ValueError(f"unknown operator {op!r}")


def max_tree_length(max_depth: int, max_args: int) -> int:
    """The longest tree the sampler can produce."""
    length = 1
    for _ in range(max_depth - 1):
        length = 2 + max_args * length
    return length


@dataclass(frozen=True)
class ListOpsTrees(Generator):
    """The trees of one length window (the generator's shape, ``generate/base.py``): ``draw(rng)``
    with a ``random.Random`` gives a tree and its length, or None when the tree would reach
    ``max_length`` (the caller keeps the trees longer than ``min_length``)."""

    name: ClassVar[str] = "listops generator"

    min_length: int = 500
    max_length: int = 2000
    max_depth: int = 10
    max_args: int = 10

    def check(self) -> None:
        check_int(self.name, "max_depth", self.max_depth, 1)
        check_int(self.name, "max_args", self.max_args, 2)
        check_int(self.name, "min_length", self.min_length, 0)
        check_int(
            self.name,
            "max_length",
            self.max_length,
            self.min_length + 2,
            why="lengths strictly between min_length and max_length are kept: min_length + 1 < max_length",
        )
        longest = max_tree_length(self.max_depth, self.max_args)
        if longest <= self.min_length:
            raise ConfigError(
                f"{self.name}: trees of max_depth {self.max_depth} and max_args {self.max_args} have at "
                f"most {longest} tokens, not more than min_length {self.min_length}"
            )

    def draw(self, rng: random.Random) -> tuple[Tree, int] | None:
        return sample_tree(rng, self.max_depth, self.max_args, self.max_length)


def _check_counts(n_train: int, n_val: int, n_test: int, seed: int) -> None:
    for name, value in (("n_train", n_train), ("n_val", n_val), ("n_test", n_test)):
        check_int(ListOpsTrees.name, name, value, 1)
    check_int(ListOpsTrees.name, "seed", seed)


def sample_dataset(
    n: int,
    min_length: int = 500,
    max_length: int = 2000,
    max_depth: int = 10,
    max_args: int = 10,
    seed: int = 0,
    quiet: bool = True,
) -> list[tuple[str, int]]:
    """``n`` distinct (source, label) pairs with lengths strictly inside the window."""
    trees = ListOpsTrees(min_length, max_length, max_depth, max_args)
    rng = random.Random(seed)
    pool: dict[str, int] = {}
    stall = 0
    with progress_bar(n, "listops", quiet=quiet, unit="sample") as bar:
        while len(pool) < n:
            drawn = trees.draw(rng)
            stall += 1
            if drawn is not None and drawn[1] > min_length:
                source = to_source(drawn[0])
                if source not in pool:
                    pool[source] = evaluate(drawn[0])
                    stall = 0
                    bar.update(1)
            if stall > MAX_STALL:
                raise ConfigError(
                    f"listops generator: found only {len(pool)} distinct samples of the {n} requested with lengths "
                    f"in ({min_length}, {max_length}); widen the window or request fewer samples"
                )
    return list(pool.items())


def _write_tsv(path: Path, rows: list[tuple[str, int]]) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8", newline="") as f:
        f.write("Source\tTarget\r\n")
        f.writelines(f"{source}\t{label}\r\n" for source, label in rows)
    os.replace(tmp, path)


def generate(
    out_dir: str | os.PathLike,
    n_train: int = 96000,
    n_val: int = 2000,
    n_test: int = 2000,
    min_length: int = 500,
    max_length: int = 2000,
    max_depth: int = 10,
    max_args: int = 10,
    seed: int = 0,
    quiet: bool = False,
) -> dict[str, Path]:
    """Write ``basic_{train,val,test}.tsv`` to ``out_dir`` and return ``{split: path}``.

    The defaults are LRA's (96000/2000/2000 samples, 500 < length < 2000, depth 10, 2-10 arguments).
    A small set for quick runs: ``generate(d, 2000, 200, 200, min_length=50, max_length=256)``.
    The files are identical for identical arguments. ``quiet`` hides the progress bar (also hidden
    when stderr is not a terminal).
    """
    _check_counts(n_train, n_val, n_test, seed)
    ListOpsTrees(min_length, max_length, max_depth, max_args)  # checks the window before anything is drawn
    rows = sample_dataset(n_train + n_val + n_test, min_length, max_length, max_depth, max_args, seed, quiet)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    bounds = {
        "train": (0, n_train),
        "val": (n_train, n_train + n_val),
        "test": (n_train + n_val, n_train + n_val + n_test),
    }
    paths = {}
    for split, name in SPLITS.items():
        lo, hi = bounds[split]
        paths[split] = out / name
        _write_tsv(paths[split], rows[lo:hi])
    return paths


#: Named configurations of the generator (``task.generate: {config: NAME}``), over :data:`DEFAULTS`:
#: ``short`` is the generated short ListOps of ``longrange demo`` and of docs/small-scale-spt.md
#: (8000/500/1000 sequences of 32-128 tokens, depth <= 4, 2-5 arguments); ``default`` is LRA's size.
CONFIGURATIONS = {
    "short": dict(n_train=8000, n_val=500, n_test=1000, min_length=32, max_length=128, max_depth=4, max_args=5),
}


def _build(root: Path, quiet: bool = True, **options) -> None:
    generate(Path(root) / "listops", quiet=quiet, **options)  # the layout the listops task reads


def _register() -> None:
    from longrange.data.generated import register_generator

    register_generator("listops", _build, DEFAULTS, CONFIGURATIONS)


_register()
