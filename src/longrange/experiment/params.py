"""The size of an experiment's model, and the value of a field that matches another model's size.

:func:`model_size` counts the parameters of the model an experiment finetunes and trains from
scratch (its supervised head on its task), built on the meta device: shapes only, so even large
presets count at once. Token tasks need their vocabulary: a task whose vocabulary is fixed (ListOps,
the pixel levels of images, DNA) counts without data; text and retrieval load theirs (generated
data is built on first use).

:func:`match_field` finds the value of an integer field (``model.d_model`` by default) whose model
comes closest in size to a target count, assuming the count grows with the value (width, depth,
state size): it brackets the target by doubling or halving, then bisects; values the model refuses
(``d_model`` not divisible by the number of heads) are stepped over.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from longrange.errors import ConfigError
from longrange.experiment.config import ExperimentConfig, apply_overrides, experiment_from_dict

#: The field ``compare --match-params`` adjusts: the model's width.
WIDTH = "model.d_model"
#: Sizes of compared models that differ by more than this fraction are warned about.
SIZE_TOLERANCE = 0.10


def fixed_vocabulary(task: str, options: dict):
    """The vocabulary of a token task that does not depend on its data (else None)."""
    from longrange.data.tasks import get_spec

    if get_spec(task, **options).input_kind != "tokens":
        return None
    if task == "listops":
        from longrange.data.listops import listops_vocabulary

        return listops_vocabulary()
    if task in ("image", "pathfinder", "path-x", "path-x-256"):
        from longrange.data.image import level_vocabulary

        return level_vocabulary()
    if task == "species":
        from longrange.data.species import ALPHABET
        from longrange.data.tokenize import Vocabulary

        return Vocabulary(list(ALPHABET), strict=True)
    return None  # text, retrieval: the characters of the training data


def model_size(exp: ExperimentConfig, vocab: int | None = None) -> dict[str, Any]:
    """``total`` and ``in_primitives`` parameters (and ``share``, ``encoder``, ``head``) of ``exp``'s
    supervised model, and its recurrent ``state`` per sequence at the task's length (None when it does
    not generate: see :func:`longrange.models.state_size`). ``vocab``: the vocabulary size of a token task instead of its own."""
    from longrange.models import parameter_report

    model, seq_len = _counted_model(exp, vocab)
    return parameter_report(model, seq_len=seq_len)


def layer_sizes(exp: ExperimentConfig, vocab: int | None = None) -> list[dict[str, Any]]:
    """Per layer of ``exp``'s supervised model: its name in the stack, parameters, those in its
    primitives, and its state at the task's length (:func:`longrange.models.layer_report`)."""
    from longrange.models import layer_report

    model, seq_len = _counted_model(exp, vocab)
    return layer_report(model, seq_len=seq_len)


def _counted_model(exp: ExperimentConfig, vocab: int | None):
    """``exp``'s supervised model on the meta device (nothing allocated) and its task's length."""
    import torch

    import longrange.data  # noqa: F401  (registers the tasks)
    from longrange.data.tasks import get_spec
    from longrange.models import build_model
    from longrange.objectives.factory import supervised_head

    spec = get_spec(exp.task.name, **exp.task.options)
    vocab_size, tokens = None, None
    if spec.input_kind == "tokens" and vocab:
        vocab_size = vocab
    elif spec.input_kind == "tokens":
        vocabulary = fixed_vocabulary(exp.task.name, exp.task.options)
        if vocabulary is None:
            from longrange.experiment.taskdata import load_data

            vocabulary = load_data(exp.task).vocab  # a missing data set is an error naming its files
        vocab_size, tokens = len(vocabulary), vocabulary.tokens
    head, n_out = supervised_head(spec)
    with torch.device("meta"):
        model = build_model(
            exp.model,
            input_kind=spec.input_kind,
            head=head,
            n_out=n_out,
            vocab_size=vocab_size,
            d_input=spec.d_input if spec.input_kind == "numeric" else None,
            vocab=tokens,
        )
    return model, spec.seq_len


def with_value(exp: ExperimentConfig, field: str, value: Any) -> ExperimentConfig:
    """``exp`` with the dotted ``field`` set to ``value`` (checked as any override is)."""
    return experiment_from_dict(apply_overrides(exp.to_dict(), [f"{field}={value}"]))


def field_value(exp: ExperimentConfig, field: str) -> Any:
    """The value of a dotted field of ``exp`` (``model.d_model``)."""
    node: Any = exp.to_dict()
    for part in field.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ConfigError(f"{field} is not a field of the experiment")
        node = node[part]
    return node


@dataclass
class Match:
    """The value of ``field`` whose model is closest in size to ``target`` parameters."""

    field: str
    value: int
    total: int
    target: int
    before: int  # the field's value in the experiment as given
    before_total: int

    @property
    def off(self) -> float:
        """The matched size relative to the target, minus 1 (+0.02: 2% larger)."""
        return self.total / self.target - 1.0

    def describe(self, label: str) -> str:
        return (
            f"{label}: {self.field} {self.before} -> {self.value}: {self.total:,} parameters "
            f"({self.off:+.1%} of {self.target:,}; was {self.before_total:,})"
        )


def match_field(
    exp: ExperimentConfig, target: int, field: str = WIDTH, vocab: int | None = None, limit: int = 1 << 16
) -> Match:
    """The value of the integer ``field`` of ``exp`` whose model has the number of parameters closest to
    ``target`` (the smaller value on a tie). ConfigError when the field is not an integer or no value
    from 1 to ``limit`` builds a model."""
    start = field_value(exp, field)
    if isinstance(start, bool) or not isinstance(start, int):
        raise ConfigError(f"--vary {field}: an integer field is needed (its value is {start!r})")
    counts: dict[int, int | None] = {}

    def count(value: int) -> int | None:
        if value not in counts:
            try:
                counts[value] = int(model_size(with_value(exp, field, value), vocab)["total"])
            except (ConfigError, ValueError):  # a value this model cannot take (e.g. not divisible by its heads)
                counts[value] = None
        return counts[value]

    def valid_near(value: int, lo: int, hi: int) -> int | None:
        """The valid value nearest ``value`` strictly between ``lo`` and ``hi``."""
        for step in range(0, hi - lo):
            for v in (value - step, value + step):
                if lo < v < hi and count(v) is not None:
                    return v
        return None

    first = valid_near(max(start, 1), 0, limit + 1)
    if first is None:
        raise ConfigError(f"no value of {field} from 1 to {limit} builds a model of {exp.label}")
    lo, hi = None, None  # valid values with count(lo) < target <= count(hi), once found
    v = first
    if count(v) < target:  # bracket the target: double up ...
        lo = v
        while hi is None and v < limit:
            nxt = valid_near(min(2 * v, limit), v, limit + 1)
            if nxt is None:
                break
            if count(nxt) < target:
                lo = v = nxt
            else:
                hi = nxt
    else:  # ... or halve down
        hi = v
        while lo is None and v > 1:
            nxt = valid_near(max(v // 2, 1), 0, v)
            if nxt is None:
                break
            if count(nxt) >= target:
                hi = v = nxt
            else:
                lo = nxt
    while lo is not None and hi is not None and hi - lo > 1:  # then bisect
        mid = valid_near((lo + hi) // 2, lo, hi)
        if mid is None:
            break
        if count(mid) < target:
            lo = mid
        else:
            hi = mid
    best = min((v for v in (lo, hi) if v is not None), key=lambda v: (abs(count(v) - target), v))
    return Match(field, best, count(best), target, start, count(start) or 0)


def size_warning(labels: list[str], totals: list[int | None]) -> str:
    """A warning when the known sizes differ by more than :data:`SIZE_TOLERANCE` ('' otherwise)."""
    known = [(label, t) for label, t in zip(labels, totals) if t]
    if len(known) < 2:
        return ""
    small, large = min(known, key=lambda x: x[1]), max(known, key=lambda x: x[1])
    if large[1] <= small[1] * (1 + SIZE_TOLERANCE):
        return ""
    return (
        f"the compared models differ in size by more than {SIZE_TOLERANCE:.0%}: {large[0]} has "
        f"{large[1] / small[1]:.2f}x the parameters of {small[0]} ({large[1]:,} vs {small[1]:,}); "
        f"--match-params adjusts each model's width ({WIDTH}) to the first's"
    )
