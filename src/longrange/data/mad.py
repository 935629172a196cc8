"""MAD's synthetic tasks (Poli et al. 2024, "Mechanistic Design and Scaling of Hybrid
Architectures", arXiv 2403.17844; athms/mad-lab) as generated tasks, with MAD's levels.

    load_task("mad-in-context-recall", seed=0)                   # MAD's baseline setting
    for level, options in mad_levels("mad-noisy-recall").items():
        load_task("mad-noisy-recall", seed=0, **options)          # "baseline", "vocab_size=48", ...

The generators and their layouts are in :mod:`longrange.data.generate.mad`; the data is drawn when
read, as the other generated sequence tasks' (:mod:`longrange.data.synthetic`): item ``i`` of a
split from ``numpy.random.default_rng([seed, task, split, epoch, i])``, ``seed`` the data seed
(``task.seed``), which also fixes memorization's key-value map (mad-lab's map at seed 12345). The
training split draws mad-lab's training instances (``is_training=True``: the recall tasks' targets
are every next token unless ``train_targets="answers"``, fuzzy recall's keys of every motif size),
validation and test its test instances, whose targets are the answers alone.

Defaults are MAD's baseline (``configs/tasks/*.yml`` ``baseline``, with ``mad/configs.py``'s
``MADConfig`` for what a task file leaves out: 1,280 test examples, ``multi_query`` true, no noise);
:data:`MAD_LEVELS` holds the benchmark's levels, each the baseline with one option changed
(``changes``), as ``make_benchmark_mad_configs`` enumerates them. Option names are the toolkit's:
``n_train`` is MAD's ``num_train_examples``, ``n_tokens`` its ``num_tokens_to_copy``.

MAD's compression is answered from the last position alone: its spec names the head that does so
(``TaskSpec.head``, ``"decode-last"``: mad-lab's autoencoder), which its supervised stage builds.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from longrange.data.dataset import TaskData
from longrange.data.generate.base import Generator
from longrange.data.generate.mad import (
    Compression,
    FuzzyInContextRecall,
    InContextRecall,
    MADGenerator,
    Memorization,
    NoisyInContextRecall,
    SelectiveCopying,
)
from longrange.data.generate.sequences import Example
from longrange.data.registry import register_task
from longrange.data.spec import TaskSpec
from longrange.data.synthetic import (
    GENERATOR_CLASSES,
    SPLIT_CODES,
    GeneratedSplit,
    _split_options,
    task_vocabulary,
)
from longrange.data.tokenize import FIRST_TOKEN_ID
from longrange.errors import ConfigError

#: Bumped whenever a MAD generator's output for the same options and seed changes.
MAD_GENERATOR_VERSION = 1
#: MAD's split sizes (``mad/configs.py``: 12,800 training and 1,280 test examples; MAD has no
#: validation split, it selects on the test set: ours is a separate draw of the test size).
MAD_SPLITS = {"n_train": 12800, "n_val": 1280, "n_test": 1280, "fresh_train": False}
#: A task's own baseline training size (``configs/tasks/memorization.yml``: 256).
_TRAIN_SIZES = {"mad-memorization": 256}

#: The levels of each task: the baseline, then each option of ``configs/tasks/<task>.yml``'s
#: ``changes`` at each of its values, the others at the baseline (athms/mad-lab ``mad/configs.py``
#: ``make_benchmark_mad_configs``). A level's name is the option it changes, ``option=value``.
_CHANGES: dict[str, dict[str, list[Any]]] = {
    "mad-in-context-recall": {
        "vocab_size": [32, 64, 128],
        "seq_len": [256, 512, 1024],
        "n_train": [6400, 3200, 1600, 800],
    },
    "mad-fuzzy-recall": {"vocab_size": [32, 64, 128], "seq_len": [256, 512, 1024], "n_train": [6400, 3200, 1600, 800]},
    "mad-noisy-recall": {
        "vocab_size": [48, 80, 144],
        "seq_len": [256, 512, 1024],
        "n_train": [6400, 3200, 1600, 800],
        "frac_noise": [0.4, 0.6, 0.8],
    },
    "mad-selective-copying": {
        "vocab_size": [32, 64, 128],
        "seq_len": [512, 1024],
        "n_train": [6400, 3200, 1600, 800],
        "n_tokens": [32, 64, 96],
    },
    "mad-memorization": {"vocab_size": [512, 1024, 2048, 4096, 8192]},
    "mad-compression": {"vocab_size": [32, 64, 128], "seq_len": [64, 128, 256], "n_train": [6400, 3200, 1600, 800]},
}
MAD_LEVELS: dict[str, dict[str, dict[str, Any]]] = {
    task: {
        "baseline": {},
        **{f"{option}={value}": {option: value} for option, values in changes.items() for value in values},
    }
    for task, changes in _CHANGES.items()
}

#: mad-lab's name of each task (``mad/registry.py``), by the toolkit's.
MAD_NAMES = {
    "mad-in-context-recall": "in-context-recall",
    "mad-fuzzy-recall": "fuzzy-in-context-recall",
    "mad-noisy-recall": "noisy-in-context-recall",
    "mad-selective-copying": "selective-copying",
    "mad-memorization": "memorization",
    "mad-compression": "compression",
}

#: MAD's tasks that are not registered tasks, and why (none: compression, the last, is registered
#: with the head that decodes every token from the last position, as mad-lab's autoencoder does).
NOT_REGISTERED: dict[str, str] = {}

_SPECS = {
    InContextRecall: (
        "MAD in-context recall: key-value pairs, recall the value of every key shown before",
        ("generated: key-value pairs, then a key shown before; answers: values of repeated keys (next-token)"),
    ),
    NoisyInContextRecall: (
        "MAD noisy in-context recall: in-context recall with pairs of noise tokens among the pairs",
        "generated: key-value pairs and noise pairs; answers: values of repeated keys (next-token)",
    ),
    FuzzyInContextRecall: (
        "MAD fuzzy in-context recall: keys and values of several tokens; recall each value",
        (
            "generated: key and value motifs of 1..k/1..v tokens, left-padded; answers: the tokens "
            "of values of repeated keys (next-token)"
        ),
    ),
    SelectiveCopying: (
        "MAD selective copying: the data tokens among blanks, in order, after the copy token",
        (
            "generated: data tokens with blanks inserted, the copy token, blanks; answers at the blanks "
            "after the copy token"
        ),
    ),
    Memorization: (
        "MAD memorization: the value of each key under a key-value map fixed by the data seed",
        "generated: pairs of a key and the insert token; answers at the insert tokens",
    ),
    Compression: (
        "MAD compression: reproduce every token of the sequence from its last position alone",
        (
            "generated: L-1 uniform tokens and the compression token; answers: every input token, decoded from "
            "the last position (the decode-last head, mad-lab's autoencoder)"
        ),
    ),
}


def mad_levels(task: str) -> dict[str, dict[str, Any]]:
    """The levels of MAD task ``task``: name -> the task options that differ from its defaults
    (the baseline is ``{}``), in mad-lab's order."""
    if task not in MAD_LEVELS:
        raise ConfigError(f"unknown MAD task {task!r}; known: {', '.join(MAD_LEVELS)}")
    return {name: dict(options) for name, options in MAD_LEVELS[task].items()}


class MADSplit(GeneratedSplit):
    """A split of a MAD task: the training split draws mad-lab's training instances, the others
    its test instances; memorization's map is that of the data seed."""

    def draw(self, rng: np.random.Generator) -> Example:
        return self.generator.draw(rng, training=self.split == "train", seed=self.seed)


def _register(cls: type[MADGenerator]) -> None:
    name = cls.name
    GENERATOR_CLASSES[name] = cls
    description, layout = _SPECS[cls]

    def spec(**opts: Any) -> TaskSpec:
        generator_opts, _ = _split_options(name, opts)
        generator = cls(**generator_opts)
        return TaskSpec(
            name=name,
            input_kind="tokens",
            seq_len=generator.length,
            n_classes=generator.vocab_size + FIRST_TOKEN_ID,
            metric="accuracy",
            mask_ratio=0.15,
            description=description,
            layout=layout,
            obtain="generated when the task is loaded; nothing to obtain",
            per_position=True,
            causal=cls.causal,
            chance=1.0 / generator.n_answers,
            head=getattr(cls, "head", None),
        )

    def load(data_dir: Path, spec: TaskSpec, seed: int = 0, skip_bad: bool = False, **opts: Any) -> TaskData:
        generator_opts, split = _split_options(name, opts)
        generator = cls(**generator_opts)
        parts = {s: MADSplit(generator, split[f"n_{s}"], seed, s, fresh=split["fresh_train"]) for s in SPLIT_CODES}
        return TaskData(
            spec,
            parts["train"],
            parts["val"],
            parts["test"],
            vocab=task_vocabulary(generator.vocab_size),
            info={"source": "generated", "seed": seed, "fresh_train": split["fresh_train"]},
        )

    splits = {**MAD_SPLITS, "n_train": _TRAIN_SIZES.get(name, MAD_SPLITS["n_train"])}
    register_task(name, spec, load, {**cls.defaults(), **splits}, generated=MAD_GENERATOR_VERSION)


#: The registered MAD tasks' generators, by task name.
MAD_TASKS: dict[str, type[MADGenerator]] = {
    cls.name: cls
    for cls in (
        InContextRecall,
        FuzzyInContextRecall,
        NoisyInContextRecall,
        SelectiveCopying,
        Memorization,
        Compression,
    )
}
#: Every MAD generator (every one is a registered task now).
MAD_GENERATORS: dict[str, type[Generator]] = dict(MAD_TASKS)

for _cls in MAD_TASKS.values():
    _register(_cls)


# --------------------------------------------------------------------------- readers of new inputs
def _register_readers() -> None:
    """``longrange predict`` reads new inputs of the MAD tasks as JSON Lines, as those of the other
    generated sequence tasks: the positions scored are those the task's held-out splits ask at,
    found from the tokens (the solver's), the answers tokens of the task's answer range."""
    from longrange.data.inputs import (
        SEQUENCE_LAYOUTS,
        SequenceLayout,
        read_sequence_inputs,
        register_input_reader,
    )
    from longrange.errors import DataFormatError

    words = {
        InContextRecall: "a value",
        NoisyInContextRecall: "a value",
        FuzzyInContextRecall: "a value token",
        SelectiveCopying: "a data token",
        Memorization: "a value",
        Compression: "a token",
    }

    def scored(tokens, obj, gen, path, number) -> list[int]:
        try:
            return [int(i) for i in gen.asked(np.asarray(tokens, dtype=np.int64))]
        except ValueError as err:
            raise DataFormatError(f"field 'tokens': {err}", path, number) from None

    def answer_range(word: str, gen: MADGenerator) -> tuple[int, int, str]:
        return (*gen.answers, word)

    for name, cls in MAD_TASKS.items():
        SEQUENCE_LAYOUTS[name] = SequenceLayout(
            ("id", "tokens", "answers"), scored, functools.partial(answer_range, words[cls])
        )
        register_input_reader(name, functools.partial(read_sequence_inputs, name))


_register_readers()
