"""What a task is: its :class:`TaskSpec` (input kind, length, classes, metric, where its data comes
from), and the accuracy of guessing its answers (:func:`chance_level`)."""

from __future__ import annotations

from dataclasses import dataclass

from longrange.errors import ConfigError


@dataclass(frozen=True)
class TaskSpec:
    """Static description of a task (with its options applied)."""

    name: str
    input_kind: str  # "tokens" | "numeric"
    seq_len: int  # maximum sequence length (including any appended <eos>)
    n_classes: int  # 0 for regression
    metric: str  # "accuracy" | "r2"
    mask_ratio: float  # default masking ratio for masked self-pretraining
    d_input: int = 1  # channels of numeric inputs
    n_targets: int = 1  # regression targets
    two_sequences: bool = False
    description: str = ""
    layout: str = ""  # the expected files under the data dir, for `longrange data info`
    obtain: str = ""  # how to obtain or generate the data
    #: Targets are per-position class indices (``IGNORE_INDEX`` where no answer is asked): the
    #: supervised objective is the per-position one, over ``n_classes`` outputs at each answer.
    per_position: bool = False
    #: The answers are predictions of what follows (next-token tasks): supervised models must be causal.
    causal: bool = False
    #: The accuracy of guessing uniformly among the task's possible answers, where it is not
    #: 1 / n_classes (per-position tasks, whose classes are the whole vocabulary); see :func:`chance_level`.
    chance: float | None = None
    #: The head the supervised objective needs, where it is not the default for the task's kind
    #: (``"tokens"`` for per-position tasks): e.g. ``"decode-last"`` for MAD's compression, whose
    #: answers must come from the last position alone (a head at every position would copy its input).
    head: str | None = None

    def __post_init__(self) -> None:
        if self.input_kind not in ("tokens", "numeric"):
            raise ConfigError(f"task {self.name}: input_kind must be 'tokens' or 'numeric', got {self.input_kind!r}")
        if self.metric not in ("accuracy", "r2"):
            raise ConfigError(f"task {self.name}: metric must be 'accuracy' or 'r2', got {self.metric!r}")
        if self.seq_len < 1:
            raise ConfigError(f"task {self.name}: seq_len must be >= 1, got {self.seq_len}")
        if not 0.0 <= self.mask_ratio < 1.0:
            raise ConfigError(f"task {self.name}: mask_ratio must be in [0, 1), got {self.mask_ratio}")
        if self.per_position and (self.n_classes < 1 or self.metric != "accuracy"):
            raise ConfigError(f"task {self.name}: per-position targets need n_classes >= 1 and metric accuracy")
        if self.chance is not None and not (0.0 < self.chance <= 1.0 and self.metric == "accuracy"):
            raise ConfigError(
                f"task {self.name}: chance must be an accuracy in (0, 1] of a task scored by accuracy, "
                f"got {self.chance!r} (metric {self.metric})"
            )


def chance_level(spec: TaskSpec) -> float | None:
    """The accuracy of guessing uniformly among the task's answers: ``spec.chance`` where the task
    states it (the generated recall tasks: 1 / the number of possible answers), else 1 / n_classes
    for a classification scored by accuracy; None for regression, and for a per-position task that
    states none. Uniform guessing, not the majority class: a split's labels are not read here."""
    if spec.chance is not None:
        return spec.chance
    if spec.metric == "accuracy" and spec.n_classes > 0 and not spec.per_position:
        return 1.0 / spec.n_classes
    return None
