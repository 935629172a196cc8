"""What a run's model was built for: :class:`HeadRecord`, the ``head`` section of a run's
``config.yaml``.

A stage builds its model from its ``model`` section (:class:`~longrange.models.config.ModelConfig`)
and a head record: the head's kind and size, the kind of input and its vocabulary or channels,
and, for the Hugging Face block, the task's tokens and how to rebuild the language model without
its snapshot. The experiment layer writes the record (:meth:`HeadRecord.to_json`) and inference
reads it back (:meth:`HeadRecord.from_json`, every field checked: a missing or mistyped field is a
:class:`~longrange.errors.DataFormatError` naming the file and the field), so that a trained run's
model is rebuilt exactly as it was trained (:meth:`HeadRecord.build`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longrange.errors import DataFormatError
from longrange.fileio import json_field

#: The fields of a head record: name -> (JSON types, required).
HEAD_FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "kind": ((str,), True),
    "n_out": ((int,), True),
    "input_kind": ((str,), True),
    "vocab_size": ((int,), False),
    "d_input": ((int,), False),
    "mask_channel": ((bool,), False),
    "vocab": ((list,), False),
    "hf_resolved": ((dict,), False),
}


@dataclass(frozen=True)
class HeadRecord:
    """The ``head`` section of a run's configuration (see the module docstring)."""

    kind: str
    n_out: int
    input_kind: str
    #: Token ids the embedding takes (token inputs).
    vocab_size: int | None = None
    #: Channels of numeric inputs, and whether a masking channel is appended (masked pretraining).
    d_input: int = 1
    mask_channel: bool = False
    #: Block ``hf``: the task's tokens, mapped to a pretrained LM's, and the LM's resolved settings.
    vocab: tuple[str, ...] | None = None
    hf_resolved: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """The section as written (``vocab`` and ``hf_resolved`` only where set)."""
        out: dict[str, Any] = {
            "kind": self.kind,
            "n_out": self.n_out,
            "input_kind": self.input_kind,
            "vocab_size": self.vocab_size,
            "d_input": self.d_input,
            "mask_channel": self.mask_channel,
        }
        if self.vocab is not None:
            out["vocab"] = list(self.vocab)
        if self.hf_resolved is not None:
            out["hf_resolved"] = self.hf_resolved
        return out

    @classmethod
    def from_json(cls, d: Any, path: Path | str | None = None) -> HeadRecord:
        """The record ``d`` (the ``head`` section of ``path``, named in errors), every field checked."""
        if isinstance(d, HeadRecord):
            return d
        if not isinstance(d, Mapping):
            raise DataFormatError(f"section 'head' must be a mapping, got {type(d).__name__}", path)
        values = {
            name: json_field(d, name, kinds, path, optional=not required, prefix="head.")
            for name, (kinds, required) in HEAD_FIELDS.items()
        }
        if values["vocab"] is not None:
            values["vocab"] = tuple(str(t) for t in values["vocab"])
        return cls(**{k: v for k, v in values.items() if v is not None})

    def build(self, model_cfg: Mapping[str, Any]) -> Any:
        """A freshly initialised model from a ``model`` section (a mapping, as saved) and this head."""
        from longrange.models.config import ModelConfig
        from longrange.models.model import build_model

        return build_model(
            ModelConfig.from_dict(dict(model_cfg)),
            input_kind=self.input_kind,
            head=self.kind,
            n_out=self.n_out,
            vocab_size=self.vocab_size,
            d_input=self.d_input,
            mask_channel=self.mask_channel,
            vocab=list(self.vocab) if self.vocab is not None else None,
            hf_resolved=self.hf_resolved,
        )


__all__ = ["HEAD_FIELDS", "HeadRecord"]
