"""Objectives: targets, masking, losses only where they belong, and exact metric sums."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from longrange.errors import ConfigError
from longrange.objectives.base import add_sums
from longrange.objectives.pretraining import MaskedPrediction, NextTokenPrediction, reverse_valid, single_sequences
from longrange.objectives.supervised import Classification, Regression


class Recorder(nn.Module):
    """A fake model: returns fixed per-position outputs and records what it was given."""

    causal = True

    def __init__(self, outputs: torch.Tensor):
        super().__init__()
        self.outputs = outputs
        self.seen = []

    def forward(self, inputs, lengths=None, inputs2=None, lengths2=None):
        self.seen.append((inputs.clone(), None if lengths is None else lengths.clone()))
        return self.outputs


def test_next_token_targets_are_inputs_shifted_by_one_on_real_positions():
    torch.manual_seed(0)
    inputs = torch.randint(5, 12, (2, 6))
    lengths = torch.tensor([6, 4])
    logits = torch.randn(2, 6, 12)
    out = NextTokenPrediction("tokens")(
        Recorder(logits), {"inputs": inputs, "lengths": lengths, "targets": torch.zeros(2)}
    )
    pred = torch.cat([logits[0, :5], logits[1, :3]])
    target = torch.cat([inputs[0, 1:6], inputs[1, 1:4]])
    torch.testing.assert_close(out.loss, F.cross_entropy(pred, target))
    assert out.sums["count"].item() == 8
    assert out.sums["correct"].item() == (pred.argmax(-1) == target).sum().item()


def test_next_token_refuses_a_bidirectional_model():
    model = Recorder(torch.zeros(1, 3, 4))
    model.causal = False
    with pytest.raises(ConfigError, match="causal model"):
        NextTokenPrediction("tokens")(
            model, {"inputs": torch.ones(1, 3, dtype=torch.long), "lengths": torch.tensor([3])}
        )


def test_reverse_valid_keeps_padding_at_the_end():
    x = torch.tensor([[1, 2, 3, 4], [5, 6, 0, 0]])
    assert reverse_valid(x, torch.tensor([4, 2])).tolist() == [[4, 3, 2, 1], [6, 5, 0, 0]]
    v = torch.arange(8.0).reshape(1, 4, 2)
    assert reverse_valid(v, torch.tensor([3]))[0, :, 0].tolist() == [4.0, 2.0, 0.0, 6.0]


def test_reverse_next_token_sees_reversed_sequences():
    model = Recorder(torch.zeros(1, 4, 9))
    NextTokenPrediction("tokens", reverse=True)(
        model, {"inputs": torch.tensor([[5, 6, 7, 0]]), "lengths": torch.tensor([3])}
    )
    assert model.seen[0][0].tolist() == [[7, 6, 5, 0]]


def test_two_sequence_batches_are_pretrained_as_separate_sequences():
    batch = {
        "inputs": torch.ones(2, 3, dtype=torch.long),
        "lengths": torch.tensor([3, 2]),
        "inputs2": torch.full((2, 5), 2),
        "lengths2": torch.tensor([5, 4]),
    }
    inputs, lengths = single_sequences(batch)
    assert inputs.shape == (4, 5) and lengths.tolist() == [3, 2, 5, 4]
    assert inputs[0, 3:].tolist() == [0, 0]


@pytest.mark.parametrize("span", [1, 3])
def test_masking_ratio_spans_and_real_positions_only(span):
    objective = MaskedPrediction("tokens", ratio=0.15, span=span)
    torch.manual_seed(1)
    lengths = torch.tensor([100, 40, 7, 1])
    chosen = objective.choose(lengths, 100)
    for row, n in zip(chosen, lengths.tolist()):
        assert not row[n:].any()
        k = row.sum().item()
        assert k >= 1
        expected = max(1, round(n * 0.15 / span)) * span
        assert k <= expected and k >= min(n, max(1, round(n * 0.15 / span)))
    if span == 3:  # masked positions come in runs (only cut short by the sequence end or merged)
        row = chosen[0].int().tolist()
        runs = [len(r) for r in "".join(map(str, row)).split("0") if r]
        assert all(r >= 3 for r in runs[:-1])


def test_masked_loss_only_counts_masked_positions():
    torch.manual_seed(0)
    objective = MaskedPrediction("tokens", ratio=0.5)
    inputs = torch.randint(5, 10, (2, 8))
    batch = {"inputs": inputs, "lengths": torch.tensor([8, 5])}
    logits = torch.randn(2, 8, 10)
    model = Recorder(logits)
    torch.manual_seed(3)
    out = objective(model, batch)
    corrupted = model.seen[0][0]
    masked = corrupted == 4
    assert masked.sum().item() == out.sums["count"].item() == 4 + 2  # round(0.5·8), round(0.5·5)
    assert not masked[1, 5:].any()
    torch.testing.assert_close(out.loss, F.cross_entropy(logits[masked], inputs[masked]))
    # Changing predictions at unmasked positions does not change the loss.
    logits2 = logits.clone()
    logits2[~masked] = 100.0
    torch.manual_seed(3)
    torch.testing.assert_close(objective(Recorder(logits2), batch).loss, out.loss)


def test_bert_replacement_proportions():
    objective = MaskedPrediction("tokens", ratio=0.5, bert=True, vocab_size=50)
    inputs = torch.randint(5, 50, (64, 256))
    g = torch.Generator().manual_seed(0)
    chosen = objective.choose(torch.full((64,), 256), 256, g)
    corrupted = objective.corrupt(inputs, chosen, g)
    n = chosen.sum().item()
    as_mask = (corrupted[chosen] == 4).float().sum().item() / n
    unchanged = (corrupted[chosen] == inputs[chosen]).float().sum().item() / n
    assert abs(as_mask - 0.8) < 0.02
    assert 0.09 < unchanged < 0.13  # 10% kept, plus random replacements that hit the same id
    assert (corrupted[~chosen] == inputs[~chosen]).all()
    assert corrupted.min() >= 4


def test_numeric_masking_zeroes_values_and_adds_indicator():
    objective = MaskedPrediction("numeric", ratio=0.5)
    x = torch.randn(2, 6, 3) + 5.0
    chosen = objective.choose(torch.tensor([6, 4]), 6)
    corrupted = objective.corrupt(x, chosen)
    assert corrupted.shape == (2, 6, 4)
    assert (corrupted[..., 3] == chosen.float()).all()
    assert (corrupted[chosen][:, :3] == 0).all()
    assert torch.equal(corrupted[~chosen][:, :3], x[~chosen])


def test_numeric_l1_and_intensity_classes():
    x = torch.tensor([[[-1.0], [0.0], [1.0], [0.5]]])
    pred = torch.zeros(1, 4, 1)
    out = MaskedPrediction("numeric", ratio=0.99).targets.loss(pred, x, torch.ones(1, 4, dtype=torch.bool))
    torch.testing.assert_close(out.loss, torch.tensor(0.625))
    cls = NextTokenPrediction("numeric", numeric_loss="classes", value_range=(-1.0, 1.0))
    assert cls.targets.quantise(x).flatten().tolist() == [0, 128, 255, 191]
    assert cls.head_size(None, d_input=3) == 768
    with pytest.raises(ConfigError, match="value_range"):
        NextTokenPrediction("numeric", numeric_loss="classes")
    with pytest.raises(ConfigError, match="mask_ratio"):
        MaskedPrediction("tokens", ratio=0.0)


def test_classification_sums_are_exact_across_batches():
    torch.manual_seed(0)
    logits = torch.randn(10, 4)
    targets = torch.randint(0, 4, (10,))
    objective = Classification()
    whole = objective(Recorder(logits), {"inputs": torch.zeros(10, 1), "targets": targets})
    total = None
    for part in (slice(0, 3), slice(3, 10)):
        total = add_sums(
            total, objective(Recorder(logits[part]), {"inputs": torch.zeros(1, 1), "targets": targets[part]}).sums
        )
    assert objective.summarize(total) == pytest.approx(objective.summarize(whole.sums))
    assert objective.summarize(total)["accuracy"] == (logits.argmax(-1) == targets).sum().item() / 10
    with pytest.raises(ValueError, match=r"class label 7 in the first batch is outside \[0, 4\)"):
        Classification()(Recorder(logits), {"inputs": torch.zeros(1, 1), "targets": targets + 4})


def test_classification_checks_the_label_range_at_the_first_batch_only(monkeypatch):
    """The check reads the labels' extremes on the host: once, not at every step."""
    import longrange.objectives.supervised as supervised

    calls = []
    check = supervised.check_class_labels
    monkeypatch.setattr(supervised, "check_class_labels", lambda *a, **k: (calls.append(1), check(*a, **k)))
    objective = Classification()
    logits, targets = torch.randn(6, 3), torch.tensor([0, 1, 2, 0, 1, 2])
    for _ in range(4):
        objective(Recorder(logits), {"inputs": torch.zeros(6, 1), "targets": targets})
    assert calls == [1]


def test_masked_prediction_uses_the_vocabulary_mask_token():
    from longrange.data import FIRST_TOKEN_ID, MASK_ID, SPECIALS, Vocabulary

    vocab = Vocabulary(["a", "b"])
    assert MASK_ID == vocab.mask_id == SPECIALS.index("<mask>") and FIRST_TOKEN_ID == len(SPECIALS) == 5
    objective = MaskedPrediction("tokens", 0.5)
    assert (objective.mask_id, objective.first_token_id) == (MASK_ID, FIRST_TOKEN_ID)
    inputs = torch.tensor([[5, 6, 5, 6]])
    chosen = torch.tensor([[True, False, True, False]])
    assert objective.corrupt(inputs, chosen).tolist() == [[MASK_ID, 6, MASK_ID, 6]]


def test_r2_over_batches_equals_the_formula():
    torch.manual_seed(0)
    y = torch.randn(20, 2)
    pred = y + 0.3 * torch.randn(20, 2)
    objective = Regression()
    total = None
    for part in (slice(0, 7), slice(7, 20)):
        total = add_sums(total, objective(Recorder(pred[part]), {"inputs": torch.zeros(1, 1), "targets": y[part]}).sums)
    r2 = 1 - ((pred - y) ** 2).sum(0) / ((y - y.mean(0)) ** 2).sum(0)
    assert objective.summarize(total)["r2"] == pytest.approx(r2.mean().item(), rel=1e-6)
