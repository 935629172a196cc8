"""Pretraining reports its accuracy at the recall events of the inputs (the input tokens that recall
determines) where a generated task has them: the probe of whether self-pretraining learns to recall."""

from __future__ import annotations

import torch
from torch import nn

from longrange.data import load_task
from longrange.data.batch import collate
from longrange.objectives.pretraining import MaskedPrediction, NextTokenPrediction

OPTIONS = dict(vocab_size=32, seq_len=24, n_pairs=5, n_recalls=3, n_train=16, n_val=8, n_test=8)


class Oracle(nn.Module):
    """A causal 'model' whose logits put the next input token first at the recall events only."""

    causal = True

    def __init__(self, batch, vocab: int, shift: int):
        super().__init__()
        self.batch, self.vocab, self.shift = batch, vocab, shift
        self.w = nn.Parameter(torch.zeros(()))

    def forward(self, inputs, lengths=None):
        b, length = inputs.shape
        logits = torch.zeros(b, length, self.vocab) + self.w
        truth = self.batch["inputs"]
        recalled = self.batch["recalled"]
        for i in range(b):
            for t in range(length):
                src = t + self.shift
                if src < length and recalled[i, src]:
                    logits[i, t, truth[i, src]] = 10.0
                else:
                    logits[i, t, 0] = 10.0  # the pad id: always wrong
        return logits


def test_items_carry_the_recall_events_and_batches_pad_them():
    data = load_task("associative-recall", **OPTIONS)
    items = [data.train[i] for i in range(4)]
    assert all(int(it["recalled"].sum()) == 3 for it in items)
    batch = collate(items)
    assert batch["recalled"].dtype == torch.bool and batch["recalled"].shape == batch["inputs"].shape
    plain = load_task("associative-recall", **{**OPTIONS, "n_recalls": 0})
    assert "recalled" not in plain.train[0] and "recalled" not in collate([plain.train[0]])


def test_causal_and_masked_pretraining_report_accuracy_at_the_recall_events():
    data = load_task("associative-recall", **OPTIONS)
    batch = collate([data.train[i] for i in range(6)])
    vocab = data.vocab_size
    out = NextTokenPrediction("tokens")(Oracle(batch, vocab, shift=1), batch)
    assert float(out.sums["recall_count"]) == 18 and float(out.sums["recall_correct"]) == 18
    summary = NextTokenPrediction.summarize(out.sums)
    assert summary["recall_accuracy"] == 1.0 and summary["accuracy"] == 18 / (6 * 23)
    masked = MaskedPrediction("tokens", ratio=0.5)
    out = masked(Oracle(batch, vocab, shift=0), batch)
    n = float(out.sums["recall_count"])
    assert 0 < n <= 18 and float(out.sums["recall_correct"]) == n  # the masked recall events, all right
    # without recall events in the layout there is no such metric
    plain = load_task("associative-recall", **{**OPTIONS, "n_recalls": 0})
    pb = collate([plain.train[i] for i in range(2)])
    model = nn.Sequential(nn.Embedding(vocab, vocab))
    model.causal = True
    out = NextTokenPrediction("tokens")(lambda x, lengths=None: model(x), pb)
    assert "recall_accuracy" not in NextTokenPrediction.summarize(out.sums)
