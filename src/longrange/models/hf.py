"""Hugging Face causal language models as baselines (``model.block: hf``).

The LM's base model (``AutoModel``: embeddings, layers, final norm; not its LM head) replaces the
encoder's embedding and the backbone; our heads (classify, regress, retrieval, tokens) sit on its
last hidden states, so the model trains, pretrains, finetunes, saves and loads like any other::

    model:
      block: hf
      hf: {model: EleutherAI/pythia-70m-deduped, pretrained: true}
      pooling: last

``model.hf``: ``model`` is a Hub id or a local snapshot directory; ``pretrained`` loads its
weights (False, the default, initialises randomly from its configuration); ``config`` overrides
fields of the configuration (e.g. ``{num_hidden_layers: 2}``); ``revision`` picks a Hub revision.
Nothing is downloaded: files come from the local directory or the Hugging Face cache
(``$HF_HOME``, ``$HF_HUB_CACHE``), and a missing file is an error saying how to download it.
The width of the features is the LM's ``hidden_size``; ``model.d_model``, ``n_layers`` and the
other fields of our own blocks are not used.

Inputs, as the SPT code feeds Pythia (``src/models/lm/model.py`` of IdoAmos/not-from-scratch):

- token tasks, pretrained: every entry of the task's vocabulary is mapped through the LM's
  tokenizer, token by token. A token that the tokenizer splits (ListOps' ``[MAX`` -> ``[``,
  ``MAX``) becomes several LM tokens in a row, as the SPT ListOps mapping does; the sequence
  grows, and per-position outputs are read at the last LM token of each task token. Pixel-level
  tasks with token inputs (``image``, ``pathfinder`` with ``input_kind: tokens``) thus feed the
  intensity as its decimal string, as SPT's ``tokenize: true`` does. Specials: ``<pad>`` -> the
  tokenizer's pad token, ``<unk>`` and ``<eos>`` -> its end-of-text token, ``<cls>`` and
  ``<mask>`` -> new rows after the tokenizer's vocabulary (the embedding grows if it has no spare rows).
- token tasks, random init: task ids are fed to the LM's embedding as they are.
- numeric tasks: a linear map of the channels into the LM's input embeddings (``inputs_embeds``).

The mapping and the LM's resolved configuration are returned by :meth:`HFModel.rebuild_info` and
kept in a run's record, so a saved run loads without the snapshot (``build_model(...,
hf_resolved=...)`` builds the same shapes, then the run's weights are loaded).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from longrange.errors import ConfigError, DataMissingError
from longrange.models.config import ModelConfig
from longrange.models.encoders import NumericEncoder
from longrange.models.model import SequenceModel, check_inputs
from longrange.models.registry import register_model
from longrange.ops.dataless import holds_data
from longrange.ops.masks import padding_mask

#: Our special tokens, in id order (``longrange.data.tokenize.SPECIALS``; a test holds them equal),
#: and what they become in the LM.
_SPECIAL_ROLES = {"<pad>": "pad", "<unk>": "eos", "<eos>": "eos", "<cls>": "new", "<mask>": "new"}


def _transformers():
    try:
        import transformers
    except ImportError as err:
        raise ConfigError(
            "model.block 'hf' needs the transformers package, an optional extra: pip install 'longrange[hf]'"
        ) from err
    return transformers


def _where(model_id: str) -> str:
    if Path(model_id).is_dir():
        return f"the directory {model_id}"
    try:
        from huggingface_hub import constants

        cache = constants.HF_HUB_CACHE
    except ImportError:  # pragma: no cover - installed with transformers
        cache = os.path.join(os.environ.get("HF_HOME", "~/.cache/huggingface"), "hub")
    return f"the Hugging Face cache {cache}"


def _missing(spec: dict, what: str, err: Exception) -> DataMissingError:
    model_id = spec["model"]
    revision = f" --revision {spec['revision']}" if spec.get("revision") else ""
    return DataMissingError(
        f"Hugging Face model {model_id!r}: its {what} is not found in {_where(model_id)} and nothing is downloaded; "
        f"download it with `huggingface-cli download {model_id}{revision}` (or set model.hf.model to a local "
        f"snapshot directory) ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
    )


@contextmanager
def _quiet(transformers):
    """No weight-loading report or progress bars: a causal LM's checkpoint loads into its base
    model with the LM head left over, which is expected here."""
    logging = transformers.utils.logging
    level, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(level)
        if bars:
            logging.enable_progress_bar()


def _dtype_kwarg(transformers) -> str:
    major, minor = (int(p) for p in transformers.__version__.split(".")[:2])
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


def _plain_config(config) -> dict[str, Any]:
    """The LM configuration as plain, YAML-safe values."""
    return json.loads(config.to_json_string(use_diff=False))


def load_lm(spec: dict, resolved: dict | None = None) -> nn.Module:
    """The LM's base model: from ``resolved`` (a plain configuration, random init), or from the
    snapshot named by ``spec`` (its configuration with ``spec['config']`` overrides; pretrained
    weights when ``spec['pretrained']``)."""
    transformers = _transformers()
    dtype = {_dtype_kwarg(transformers): torch.get_default_dtype()}
    if resolved is not None:
        resolved = dict(resolved)
        config = transformers.AutoConfig.for_model(resolved.pop("model_type"), **resolved)
        return transformers.AutoModel.from_config(config, **dtype)
    kwargs = {"revision": spec.get("revision"), "local_files_only": True}
    try:
        config = transformers.AutoConfig.from_pretrained(spec["model"], **kwargs, **(spec.get("config") or {}))
    except (OSError, ValueError) as err:
        raise _missing(spec, "configuration (config.json)", err) from None
    if not spec.get("pretrained", False):
        return transformers.AutoModel.from_config(config, **dtype)
    try:
        with _quiet(transformers):
            return transformers.AutoModel.from_pretrained(spec["model"], config=config, **kwargs, **dtype)
    except (OSError, ValueError) as err:
        raise _missing(spec, "pretrained weights", err) from None


def token_map(spec: dict, vocab: Sequence[str], lm: nn.Module) -> list[list[int]]:
    """LM token ids of every id of the task's vocabulary (specials first, as in ``data/tokenize.py``)."""
    transformers = _transformers()
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(
            spec["model"], revision=spec.get("revision"), local_files_only=True
        )
    except (OSError, ValueError) as err:
        raise _missing(spec, "tokenizer", err) from None
    eos = next(
        (t for t in (tokenizer.eos_token_id, tokenizer.unk_token_id, tokenizer.bos_token_id) if t is not None), None
    )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    if eos is None:
        raise ConfigError(
            f"the tokenizer of {spec['model']!r} has no end-of-text, unknown or begin token to map <eos>/<unk> to"
        )
    next_new = len(tokenizer)
    out: list[list[int]] = []
    for role in _SPECIAL_ROLES.values():
        if role == "new":
            out.append([next_new])
            next_new += 1
        else:
            out.append([pad if role == "pad" else eos])
    for tok in vocab:
        ids = tokenizer(tok, add_special_tokens=False)["input_ids"]
        if not ids:
            raise ConfigError(f"task token {tok!r} maps to no token of the tokenizer of {spec['model']!r}")
        out.append([int(i) for i in ids])
    rows = lm.get_input_embeddings().num_embeddings
    if next_new > rows:
        lm.resize_token_embeddings(next_new)
    return out


class HFTokenEncoder(nn.Module):
    """Task token ids (batch, L) -> LM token ids (batch, L') with L' >= L (see the module docstring).

    ``sub_ids`` (V, K) holds the LM tokens of every task id (padded with -1), ``sub_len`` (V,) their
    number; both are saved with the model.
    """

    input_kind = "tokens"

    def __init__(self, mapping: Sequence[Sequence[int]], pad_id: int = 0):
        super().__init__()
        width = max(len(m) for m in mapping)
        sub = torch.full((len(mapping), width), -1, dtype=torch.long)
        for i, ids in enumerate(mapping):
            sub[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        self.register_buffer("sub_ids", sub)
        self.register_buffer("sub_len", torch.tensor([len(m) for m in mapping], dtype=torch.long))
        #: The mapping as given (the buffers hold it too; built on the meta device, only this does).
        self.mapping = [[int(i) for i in ids] for ids in mapping]
        self.vocab_size = len(mapping)
        self.pad_id = pad_id

    @property
    def expands(self) -> bool:
        return self.sub_ids.shape[1] > 1

    def forward(self, inputs: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """-> (LM ids (batch, L'), LM lengths (batch,), ends (batch, L): the LM position of the last
        LM token of each task position)."""
        if inputs.dim() != 2 or inputs.is_floating_point():
            raise ValueError(
                f"token inputs must be integer ids of shape (batch, length), got {inputs.dtype} {tuple(inputs.shape)}"
            )
        # Ids without data (dry runs) have no range to check; a compiled model would split its graph
        # at a check by value, and there an id out of range is the mapping's index error.
        if inputs.numel() and holds_data(inputs) and not torch.compiler.is_compiling():
            low, high = (int(v) for v in torch.aminmax(inputs))
            if low < 0 or high >= self.vocab_size:
                raise ValueError(
                    f"token id {low if low < 0 else high} is outside the vocabulary of size {self.vocab_size}"
                )
        inputs = inputs.long()
        if not self.expands:
            ends = torch.arange(inputs.shape[1], device=inputs.device).expand_as(inputs)
            return self.sub_ids[inputs, 0], lengths, ends
        real = padding_mask(lengths, inputs.shape[1])
        counts = self.sub_len[inputs] * real
        new_lengths = counts.sum(1)
        starts = counts.cumsum(1) - counts
        # Without data (dry runs) the longest mapped sequence is taken at its bound: every token at the widest mapping.
        longest = int(new_lengths.max()) if holds_data(new_lengths) else inputs.shape[1] * self.sub_ids.shape[1]
        out = torch.full((inputs.shape[0], max(longest, 1)), self.pad_id, dtype=torch.long, device=inputs.device)
        rows = torch.arange(inputs.shape[0], device=inputs.device)[:, None].expand_as(inputs)
        for k in range(self.sub_ids.shape[1]):
            take = k < counts
            out[rows[take], (starts + k)[take]] = self.sub_ids[inputs, k][take]
        return out, new_lengths, (starts + counts - 1).clamp_min(0)


class HFBackbone(nn.Module):
    """The LM's base model on input embeddings (batch, L, hidden) with a padding mask; one position
    at a time through its key-value cache (the state)."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm
        self.d_model = lm.config.hidden_size

    def embed(self, ids: Tensor) -> Tensor:
        return self.lm.get_input_embeddings()(ids)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        # The LM's own mask code reads the mask's values; without data (dry runs, whose sequences are
        # all full length) the mask is left out, which is what that code does with a mask of ones.
        attention = None if mask is None or not holds_data(mask) else mask.long()
        h = self.lm(inputs_embeds=x, attention_mask=attention, use_cache=False).last_hidden_state
        return h if mask is None else h * mask.unsqueeze(-1).to(h.dtype)

    def default_state(self, batch_size: int, device=None, dtype=None) -> Any:
        return None  # an empty key-value cache

    def step(self, x: Tensor, past: Any) -> tuple[Tensor, Any]:
        """One position (batch, hidden) -> (batch, hidden), with the cache updated in place."""
        out = self.lm(inputs_embeds=x.unsqueeze(1), past_key_values=past, use_cache=True)
        return out.last_hidden_state[:, 0], out.past_key_values

    def mixers(self) -> list[nn.Module]:
        """The attention modules of the LM's layers (for parameter reports)."""
        return [m for m in self.lm.modules() if type(m).__name__.endswith("Attention")]


class HFModel(SequenceModel):
    """A Hugging Face causal LM with our heads: a :class:`SequenceModel` whose backbone is the LM and
    whose embedding goes through the LM's input embeddings (task tokens mapped to LM tokens)."""

    def __init__(self, cfg: ModelConfig, encoder: nn.Module, lm: nn.Module, head_kind: str, n_out: int):
        super().__init__(cfg, encoder, head_kind, n_out, backbone=HFBackbone(lm))

    def rebuild_info(self) -> dict[str, Any]:
        """What rebuilds this model's shapes without the snapshot (``build_model(hf_resolved=...)``)."""
        mapping = None
        if isinstance(self.encoder, HFTokenEncoder):
            mapping = [list(ids) for ids in self.encoder.mapping]
        return {"config": _plain_config(self.backbone.lm.config), "token_map": mapping}

    def embed(self, inputs: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        if isinstance(self.encoder, HFTokenEncoder):
            ids, lengths, ends = self.encoder(inputs, lengths)
            return self.backbone.embed(ids), lengths, ends if self.encoder.expands else None
        return self.encoder(inputs), lengths, None

    def embed_step(self, x_t: Tensor, pos: int) -> Tensor:
        lengths = torch.ones(x_t.shape[0], dtype=torch.long, device=x_t.device)
        return self.embed(x_t.unsqueeze(1), lengths)[0][:, 0]

    def default_state(self, batch_size: int, device=None, dtype=None) -> dict[str, Any]:
        if isinstance(self.encoder, HFTokenEncoder) and self.encoder.expands:
            raise RuntimeError("step() needs one LM token per task token; this task's tokens map to several")
        return super().default_state(batch_size, device=device, dtype=dtype)


@register_model("hf")
def build_hf_model(
    cfg: ModelConfig,
    *,
    input_kind: str,
    head: str,
    n_out: int,
    vocab_size: int | None = None,
    d_input: int = 1,
    mask_channel: bool = False,
    vocab: Sequence[str] | None = None,
    hf_resolved: dict | None = None,
) -> HFModel:
    """The model of ``cfg`` (``block: hf``) for a task (see :func:`longrange.models.model.build_model`).

    ``vocab`` is the task's token strings (without the specials), needed for pretrained LMs on
    token tasks; ``hf_resolved`` (from :meth:`HFModel.rebuild_info`) rebuilds a saved model
    without the snapshot.
    """
    check_inputs(input_kind, mask_channel)
    spec = cfg.hf
    lm = load_lm(spec, None if hf_resolved is None else hf_resolved["config"])
    hidden = lm.config.hidden_size
    if input_kind == "tokens":
        if not vocab_size:
            raise ConfigError("a token task needs its vocabulary size")
        if hf_resolved is not None and hf_resolved.get("token_map") is not None:
            mapping = hf_resolved["token_map"]
        elif spec.get("pretrained", False):
            if vocab is None:
                raise ConfigError(
                    f"a pretrained Hugging Face LM ({spec['model']!r}) on a token task needs the task's vocabulary "
                    "(build_model(..., vocab=data.vocab.tokens)) to map its tokens to the LM's"
                )
            mapping = token_map(spec, vocab, lm)
        else:
            rows = lm.get_input_embeddings().num_embeddings
            if vocab_size > rows:
                raise ConfigError(
                    f"the task's {vocab_size} token ids do not fit the LM's {rows} embeddings; set model.hf.config.vocab_size"
                )
            mapping = [[i] for i in range(vocab_size)]
        if len(mapping) != vocab_size:
            raise ConfigError(f"the token mapping has {len(mapping)} entries for a vocabulary of {vocab_size}")
        pad = getattr(lm.config, "pad_token_id", None)
        encoder: nn.Module = HFTokenEncoder(mapping, pad_id=pad if isinstance(pad, int) and pad >= 0 else 0)
    else:
        encoder = NumericEncoder(d_input, hidden, mask_channel)
    return HFModel(cfg, encoder, lm, head, n_out)
