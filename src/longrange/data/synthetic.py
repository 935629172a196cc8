"""Generated sequence tasks: selective copying, induction heads, MQAR and single-query associative recall.

The data is generated when the task is loaded, nothing is written: item ``i`` of a split is drawn
from ``numpy.random.default_rng([seed, task, split, epoch, i])`` (``seed`` the task's data seed,
``task.seed``), so the same options and seed give the same examples in any process, data-loader
worker or order of building, and two configurations never share a stored file to mix up. The
generators and their layouts are in :mod:`longrange.data.generate.sequences`; docs/data.md gives
the published settings each follows.

Split sizes are options (``n_train``, ``n_val``, ``n_test``). With ``fresh_train`` the training
items are drawn anew every epoch (epoch ``e`` uses stream ``e``; the training loop calls
``set_epoch``), so a run of ``S`` steps of batch ``B`` sees ``S·B`` fresh examples when
``n_train`` is a multiple of ``B``: the papers' "fresh data every step". Validation and test are
fixed (epoch 0).

Tokens: the task's ``vocab_size`` tokens take ids ``5 .. vocab_size + 4`` after the five specials.
Per-position tasks (``selective-copying``, ``induction-heads``, ``mqar``) have targets of the
answers' ids at the positions that ask one and :data:`~longrange.data.batch.IGNORE_INDEX`
elsewhere, over ``n_classes = vocab_size + 5`` outputs; ``induction-heads`` and ``mqar`` are
next-token tasks, whose models must be causal. ``associative-recall`` is a classification over the
``vocab_size - vocab_size // 2`` values.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from longrange.data.batch import IGNORE_INDEX
from longrange.data.dataset import TaskData
from longrange.data.generate.base import Generator, check_bool, check_int, example_rng, stream_code
from longrange.data.generate.sequences import (
    AssociativeRecall,
    Example,
    InductionHeads,
    MultiQueryAR,
    SelectiveCopying,
)
from longrange.data.registry import register_task
from longrange.data.spec import TaskSpec
from longrange.data.tokenize import FIRST_TOKEN_ID, Vocabulary

SPLIT_CODES = {"train": 0, "val": 1, "test": 2}
#: Bumped whenever a generator's output for the same options and seed changes (the data's identity).
GENERATOR_VERSION = 1


class GeneratedSplit(Dataset):
    """``n`` examples of one split, each drawn when it is read (see the module docstring).

    Items: ``{"inputs": LongTensor (L,), "target": LongTensor (L,) per-position ids or () class}``,
    and ``"recalled"``: BoolTensor (L,), the input tokens that recall determines, where a layout has them.
    """

    def __init__(self, generator: Generator, n: int, seed: int, split: str, fresh: bool = False):
        self.generator, self.n, self.seed, self.split = generator, int(n), int(seed), split
        self.fresh = bool(fresh) and split == "train"
        self.epoch = 0
        self._key = (stream_code(generator.name), SPLIT_CODES[split])

    def set_epoch(self, epoch: int) -> None:
        """Draw the training items of ``epoch`` (with ``fresh_train``; otherwise nothing changes)."""
        if self.fresh:
            self.epoch = int(epoch)

    def __len__(self) -> int:
        return self.n

    def example(self, i: int) -> Example:
        """Item ``i`` of the current epoch, in task tokens."""
        if not 0 <= i < self.n:
            raise IndexError(f"index {i} out of range for the {self.n} {self.split} examples")
        return self.draw(example_rng(self.seed, *self._key, self.epoch, i))

    def draw(self, rng: np.random.Generator) -> Example:
        """One example of this split from the random stream ``rng`` (a split whose generator draws
        its splits differently passes it what it needs)."""
        return self.generator.draw(rng)

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        ex = self.example(int(i))
        item = {"inputs": torch.from_numpy(ex.inputs + FIRST_TOKEN_ID)}
        if ex.targets is None:
            item["target"] = torch.tensor(ex.label, dtype=torch.long)
        else:
            item["target"] = torch.from_numpy(
                np.where(ex.targets == IGNORE_INDEX, IGNORE_INDEX, ex.targets + FIRST_TOKEN_ID)
            )
        if ex.recalled is not None:  # the recall events of the inputs: pretraining reports its accuracy there
            item["recalled"] = torch.from_numpy(ex.recalled)
        return item


def task_vocabulary(vocab_size: int) -> Vocabulary:
    """The specials, then task tokens ``0 .. vocab_size - 1`` (named by their number)."""
    return Vocabulary([str(t) for t in range(vocab_size)], strict=True)


#: Options every generated task has besides its generator's, with their defaults per task.
SPLIT_OPTIONS = ("n_train", "n_val", "n_test", "fresh_train")


def _split_options(name: str, opts: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(generator options, split options) of a task's options, the split options checked."""
    split = {k: opts[k] for k in SPLIT_OPTIONS}
    for k in ("n_train", "n_val", "n_test"):
        check_int(name, k, split[k], 1, why="examples in the split")
    check_bool(name, "fresh_train", split["fresh_train"])
    return {k: v for k, v in opts.items() if k not in SPLIT_OPTIONS}, split


#: The generator class of each generated sequence task, by task name.
GENERATOR_CLASSES: dict[str, type[Generator]] = {}


def generator_of(task: str, options: dict[str, Any]) -> Generator:
    """The generator of the generated sequence task ``task`` at ``options`` (the task's defaults
    for those not given; the split options are not the generator's), its options checked."""
    from longrange.data.registry import task_options

    generator_opts, _ = _split_options(task, {**task_options(task), **options})
    return GENERATOR_CLASSES[task](**generator_opts)


def register_generated(
    cls: type[Generator],
    splits: dict[str, Any],
    *,
    description: str,
    layout: str,
    per_position: bool,
    causal: bool,
    n_classes: Callable[[Generator], int],
    split_class: type[GeneratedSplit] | None = None,
    version: int = GENERATOR_VERSION,
) -> None:
    """Register the generated task of generator ``cls``: its splits' sizes and defaults ``splits``,
    drawn by ``split_class`` (:class:`GeneratedSplit`), its data's identity bumped by ``version``."""
    name = cls.name
    split_class = split_class or GeneratedSplit
    GENERATOR_CLASSES[name] = cls

    def spec(**opts: Any) -> TaskSpec:
        generator_opts, _ = _split_options(name, opts)
        generator = cls(**generator_opts)
        return TaskSpec(
            name=name,
            input_kind="tokens",
            seq_len=generator.seq_len,
            n_classes=n_classes(generator),
            metric="accuracy",
            mask_ratio=0.15,
            description=description,
            layout=layout,
            obtain="generated when the task is loaded; nothing to obtain",
            per_position=per_position,
            causal=causal,
            chance=1.0 / generator.n_answers,
        )

    def load(data_dir: Path, spec: TaskSpec, seed: int = 0, skip_bad: bool = False, **opts: Any) -> TaskData:
        generator_opts, split = _split_options(name, opts)
        generator = cls(**generator_opts)
        parts = {s: split_class(generator, split[f"n_{s}"], seed, s, fresh=split["fresh_train"]) for s in SPLIT_CODES}
        return TaskData(
            spec,
            parts["train"],
            parts["val"],
            parts["test"],
            vocab=task_vocabulary(generator.vocab_size),
            info={"source": "generated", "seed": seed, "fresh_train": split["fresh_train"]},
        )

    register_task(name, spec, load, {**cls.defaults(), **splits}, generated=version)


def _per_position_classes(generator: Generator) -> int:
    return generator.vocab_size + FIRST_TOKEN_ID


register_generated(
    SelectiveCopying,
    {"n_train": 10000, "n_val": 1000, "n_test": 1000, "fresh_train": True},
    description="Selective copying (Mamba §3.1): repeat the data tokens scattered among noise, in order, at the markers",
    layout="generated: n_tokens data tokens at random positions among noise, then n_tokens markers; "
    "answers at the markers",
    per_position=True,
    causal=False,
    n_classes=_per_position_classes,
)
register_generated(
    InductionHeads,
    {"n_train": 65536, "n_val": 1000, "n_test": 1000, "fresh_train": True},
    description="Induction heads (Mamba §4.1.2): after the final trigger, the token that followed the earlier trigger",
    layout="generated: random data tokens, a trigger at a random position, a trigger at the end; the answer at the end",
    per_position=True,
    causal=True,
    n_classes=_per_position_classes,
)
register_generated(
    MultiQueryAR,
    {"n_train": 100000, "n_val": 3000, "n_test": 3000, "fresh_train": False},
    description="MQAR (Zoology): key-value pairs, then every key queried once; answer each query with its value",
    layout="generated: n_pairs key-value pairs, then the keys as queries at power-law gaps; answers at the queries",
    per_position=True,
    causal=True,
    n_classes=_per_position_classes,
)
register_generated(
    AssociativeRecall,
    {"n_train": 100000, "n_val": 3000, "n_test": 3000, "fresh_train": False},
    description="Associative recall, single query: the class of the value of the key that ends the sequence",
    layout="generated: n_pairs key-value pairs, filler, one of the keys last; label its value's index",
    per_position=False,
    causal=False,
    n_classes=lambda g: g.n_classes,
)
