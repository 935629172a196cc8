"""The MAD fragments (``presets/mad/``): MAD's backbone, training defaults and default layer
configurations (athms/mad-lab ``configs/layers/*.yml``) as ``_``-prefixed fragments without a task.
Each layer fragment, given a task, builds MAD's stack ``X swiglu X swiglu`` at width 128, and its
layers have the parameter counts that MAD's modules have (counted from mad-lab's code: each layer
plus the RMSNorm before it), except Hyena, whose fragment keeps the toolkit's inner width (the CPU
study's models were fixed with it)."""

from __future__ import annotations

import pytest
import torch

import longrange.data  # noqa: F401  (registers the tasks)
from longrange.experiment.config import deep_merge, experiment_from_dict, list_presets, load_preset
from longrange.models import layer_report
from longrange.models.model import build_model

D = 128
NORM = D  # the RMSNorm before each layer (language_model.py:49)
TASK = {"task": {"name": "selective-copying", "options": {"seq_len": 128, "vocab_size": 16, "n_tokens": 16}}}

#: MAD's parameter counts per layer at width 128, from mad-lab's modules.
SWIGLU = 2 * D * 352 + 352 * D  # w1, w2, w3 without biases; hidden 16 * ceil(int(2 * 4 * 128 / 3) / 16) = 352
ATTENTION = D * 3 * D + 3 * D + D * D + D  # flash-attn MHA: Wqkv and out_proj with biases
MAMBA = (
    D * 4 * D
    + 2 * D * 4
    + 2 * D  # in_proj (no bias), conv (with bias)
    + 2 * D * (8 + 2 * 4)
    + 8 * 2 * D
    + 2 * D  # x_proj, dt_proj (dt_rank 8, d_state 4)
    + 2 * D * 4
    + 2 * D
    + 2 * D * D
)  # A_log, D, out_proj (no bias)


def gla(heads: int) -> int:
    return 4 * D * D + (D * 16 + 16 * D + D) + D * D + D // heads  # q, k, v, g; low-rank gate; o; head norm


def linear_attention(heads: int) -> int:
    head = D // heads  # q, k, v, out_proj without biases; two Hadamard maps (q, k) of two Linear(head, head)
    return 4 * D * D + 2 * 2 * (head * head + head)


def hyena_params(l_max: int, inner: int, proj: int, filt: int, filters: int) -> int:
    """MAD's Hyena operator at width D: in_proj D -> proj (tiled to 3 x inner), a short filter of 3
    taps and a bias per tiled channel, z over l_max positions, the filter MLP of width ``filt`` (sine
    frequencies of its width) with ``filters`` outputs, a bias per filter, out_proj inner -> D."""
    return (
        (D * proj + proj)
        + (3 * inner * 3 + 3 * inner)
        + l_max * 3
        + (3 * filt + filt)
        + 2 * (filt * filt + filt)
        + filt * filters
        + filt
        + filters
        + (inner * D + D)
    )


def mad_hyena(l_max: int) -> int:  # in_proj 128 -> 384 tiled 4x, 512 channels and filters, out_proj 512 -> 128
    return hyena_params(l_max, inner=4 * D, proj=3 * D, filt=4, filters=4 * D)


def mad_mh_hyena(l_max: int) -> int:  # in_proj 128 -> 96 tiled 4x; the yml's num_heads 16 is each head's width: 8 heads
    return hyena_params(l_max, inner=D, proj=3 * D // 4, filt=2, filters=8)


EXPECTED = {
    "attention": ("attention", ATTENTION),
    "mh-attention": ("attention", ATTENTION),
    "sliding-attention": ("attention", ATTENTION),
    "mh-sliding-attention": ("attention", ATTENTION),
    "gated-linear-attention": ("gla", gla(1)),
    "mh-gated-linear-attention": ("gla", gla(8)),
    "mamba": ("mamba-s6", MAMBA),
    "mh-hyena": ("hyena", mad_mh_hyena(128)),
    "linear-attention": ("linear-attention", linear_attention(1)),
    "mh-linear-attention": ("linear-attention", linear_attention(16)),
}
HEADS = {
    "attention": 1,
    "mh-attention": 16,
    "sliding-attention": 1,
    "mh-sliding-attention": 16,
    "gated-linear-attention": 1,
    "mh-gated-linear-attention": 8,
    "linear-attention": 1,
    "mh-linear-attention": 16,
}


def stack(fragment: str):
    exp = experiment_from_dict(deep_merge(load_preset(f"mad/layers/_{fragment}"), TASK))
    with torch.device("meta"):
        model = build_model(exp.model, input_kind="tokens", vocab_size=16, head="tokens", n_out=16)
    return exp, layer_report(model, seq_len=128)


def test_the_fragments_are_not_presets():
    assert not [n for n in list_presets() if n.startswith("mad/")]
    base = load_preset("mad/_base")["model"]
    assert (base["block"], base["mlp"], base["d_model"], base["norm"], base["pos_embedding"]) == (
        "residual",
        "none",
        128,
        "rms",
        "none",
    )
    train = load_preset("mad/_train")["train"]
    assert (train["lr"], train["weight_decay"], train["epochs"], train["batch_size"], train["schedule"]) == (
        5e-4,
        0.0,
        200,
        128,
        "cosine",
    )
    assert train["min_lr_ratio"] * train["lr"] == pytest.approx(1e-6)


@pytest.mark.parametrize("fragment", sorted(EXPECTED))
def test_a_layer_fragment_builds_mads_stack_with_mads_counts(fragment):
    exp, rows = stack(fragment)
    name, count = EXPECTED[fragment]
    assert [r["name"] for r in rows] == [name, "swiglu", name, "swiglu"]
    assert [r["params"] for r in rows] == [count + NORM, SWIGLU + NORM] * 2
    assert exp.model.d_model == D and exp.model.direction == "causal"
    if fragment in HEADS:
        assert exp.model.n_heads == HEADS[fragment]
    if "attention" in fragment and "linear" not in fragment:
        assert exp.model.rope and exp.model.attn_window == (32 if "sliding" in fragment else None)


def test_hyena_has_mads_options_but_not_its_inner_width():
    exp, rows = stack("hyena")
    options = exp.model.layers[0]["options"]
    assert (options["order"], options["short_filter_order"], options["filter_order"], options["l_max"]) == (
        2,
        3,
        4,
        128,
    )
    assert options["pos_emb_lr_scale"] == options["filter_lr_scale"] == 1.0
    assert [r["name"] for r in rows] == ["hyena", "swiglu", "hyena", "swiglu"]
    ours = rows[0]["params"] - NORM
    assert mad_hyena(128) == 124_348 and ours == 68_668  # MAD's 4x inner width is not reproduced


def test_mh_hyena_is_mads_layer():
    exp, rows = stack("mh-hyena")
    options = exp.model.layers[0]["options"]
    assert (options["head_dim"], options["proj_groups"], options["inner_factor"], options["filter_order"]) == (
        16,
        4,
        1,
        2,
    )
    assert mad_mh_hyena(128) == 30_862 and rows[0]["params"] - NORM == 30_862


def test_the_channel_mixer_fragments():
    assert load_preset("mad/layers/_swiglu")["model"] == {"mlp_ratio": 4.125}  # 2/3 * 4.125 * 128 = 352, MAD's width
    assert load_preset("mad/layers/_mlp")["model"] == {"mlp_ratio": 4.0}
