"""The per-position objective: loss and metrics at the answer positions only, its fast path held to
the slow reference, the batch format of per-position targets, and how a task selects it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from longrange.data import IGNORE_INDEX, load_task
from longrange.data.batch import check_position_labels, collate
from longrange.errors import ConfigError, DataFormatError
from longrange.models.config import ModelConfig
from longrange.models.model import build_model
from longrange.objectives.base import add_sums
from longrange.objectives.factory import ObjectiveConfig, make_objective, supervised_head
from longrange.objectives.pretraining import MaskedPrediction, NextTokenPrediction
from longrange.objectives.supervised import PositionClassification

I = IGNORE_INDEX


class FixedLogits(nn.Module):
    """A fake per-position model whose outputs are a parameter (to read the loss's gradient)."""

    causal = True

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.logits = nn.Parameter(logits.clone())

    def forward(self, inputs, lengths=None, positions=None):
        return self.logits if positions is None else self.logits[positions]


def batch_of(targets):
    targets = torch.tensor(targets)
    return {
        "inputs": torch.ones_like(targets),
        "lengths": torch.full((targets.shape[0],), targets.shape[1]),
        "targets": targets,
    }


def test_loss_and_metrics_at_the_answers_only():
    torch.manual_seed(0)
    logits = torch.randn(4, 5, 7)
    pred = logits.argmax(-1)
    # sequence 0: every answer right; 1: one of two wrong; 2: no answers; 3: one answer, wrong
    targets = [
        [I, pred[0, 1].item(), I, pred[0, 3].item(), I],
        [pred[1, 0].item(), I, I, I, (pred[1, 4].item() + 1) % 7],
        [I, I, I, I, I],
        [I, I, (pred[3, 2].item() + 3) % 7, I, I],
    ]
    batch = batch_of(targets)
    for fast in (True, False):
        objective = PositionClassification(fast=fast)
        out = objective(FixedLogits(logits), batch)
        expected = F.cross_entropy(logits.transpose(1, 2), batch["targets"], ignore_index=I)  # PyTorch's own masking
        torch.testing.assert_close(out.loss, expected)
        sums = {k: v.item() for k, v in out.sums.items()}
        assert sums["count"] == 5 and sums["correct"] == 3
        assert sums["sequences"] == 3 and sums["sequences_correct"] == 1
        metrics = objective.summarize(out.sums)
        assert metrics["accuracy"] == pytest.approx(3 / 5) and metrics["sequence_accuracy"] == pytest.approx(1 / 3)
        assert metrics["loss"] == pytest.approx(expected.item())


def test_outputs_at_positions_without_an_answer_get_no_gradient():
    torch.manual_seed(1)
    targets = torch.full((2, 6), I)
    targets[0, 2], targets[1, 5], targets[1, 0] = 3, 1, 4
    model = FixedLogits(torch.randn(2, 6, 5))
    PositionClassification()(model, batch_of(targets.tolist())).loss.backward()
    grad_norm = model.logits.grad.abs().sum(-1)
    assert (grad_norm[targets != I] > 0).all() and (grad_norm[targets == I] == 0).all()
    # and changing what the model says there changes nothing
    other = FixedLogits(torch.where((targets == I).unsqueeze(-1), torch.randn(2, 6, 5), model.logits.detach()))
    torch.testing.assert_close(
        PositionClassification()(other, batch_of(targets.tolist())).loss,
        PositionClassification()(model, batch_of(targets.tolist())).loss,
    )


def test_sums_add_up_across_batches():
    torch.manual_seed(2)
    logits = torch.randn(6, 4, 5)
    targets = torch.randint(0, 5, (6, 4))
    targets[torch.rand(6, 4) < 0.5] = I
    model, objective = FixedLogits(logits), PositionClassification()
    whole = objective(model, batch_of(targets.tolist())).sums
    parts = None
    for rows in (slice(0, 2), slice(2, 6)):
        part = FixedLogits(logits[rows])
        parts = add_sums(parts, objective(part, batch_of(targets[rows].tolist())).sums)
    assert objective.summarize(whole) == pytest.approx(objective.summarize(parts))


@pytest.mark.parametrize("block, primitive", [("simple", "s4d"), ("transformer", "attention")])
def test_fast_path_matches_the_reference_in_values_and_gradients(block, primitive, device):
    """The head applied at the answers only equals the head everywhere, then selected."""
    torch.manual_seed(3)
    cfg = ModelConfig(
        block=block, primitive=primitive, n_layers=2, d_model=16, d_state=4, n_heads=2, direction="causal", dropout=0.0
    )
    model = build_model(cfg, input_kind="tokens", vocab_size=12, head="tokens", n_out=12).to(device)
    inputs = torch.randint(5, 12, (3, 10), device=device)
    targets = torch.full((3, 10), I, device=device)
    targets[0, 9], targets[1, 3], targets[1, 7], targets[2, 0] = 6, 7, 11, 5
    batch = {"inputs": inputs, "lengths": torch.tensor([10, 10, 8], device=device), "targets": targets}
    results = []
    for fast in (True, False):
        model.zero_grad()
        out = PositionClassification(fast=fast)(model, batch)
        out.loss.backward()
        results.append((out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (fast_out, fast_grads), (ref_out, ref_grads) = results
    torch.testing.assert_close(fast_out.loss, ref_out.loss)
    assert {k: v.item() for k, v in fast_out.sums.items()} == pytest.approx(
        {k: v.item() for k, v in ref_out.sums.items()}
    )
    assert fast_grads.keys() == ref_grads.keys() and len(fast_grads) > 4
    for name in fast_grads:
        torch.testing.assert_close(fast_grads[name], ref_grads[name], rtol=1e-5, atol=1e-6, msg=name)
    rows = model(inputs, batch["lengths"], positions=targets != I)
    torch.testing.assert_close(rows, model(inputs, batch["lengths"])[targets != I])


def test_positions_need_a_per_position_head_and_the_inputs_shape():
    cfg = ModelConfig(block="simple", primitive="s4d", n_layers=1, d_model=8, d_state=4, direction="causal")
    inputs = torch.randint(5, 9, (2, 6))
    pooled = build_model(cfg, input_kind="tokens", vocab_size=9, head="classify", n_out=3)
    with pytest.raises(ValueError, match="per-position head; the model has a 'classify' head"):
        pooled(inputs, positions=torch.ones(2, 6, dtype=torch.bool))
    tokens = build_model(cfg, input_kind="tokens", vocab_size=9, head="tokens", n_out=9)
    with pytest.raises(ValueError, match=r"boolean mask of the inputs' shape \(2, 6\)"):
        tokens(inputs, positions=torch.ones(2, 5, dtype=torch.bool))


def test_a_task_that_asks_next_token_answers_refuses_a_bidirectional_model():
    model = FixedLogits(torch.zeros(1, 3, 4))
    model.causal = False
    batch = batch_of([[I, I, 2]])
    with pytest.raises(ConfigError, match="needs a causal model"):
        PositionClassification(causal=True)(model, batch)
    PositionClassification(causal=False)(model, batch)  # selective copying: either direction


def test_labels_outside_the_head_are_an_error():
    with pytest.raises(DataFormatError, match=r"per-position label 9 in the first batch is outside \[0, 4\)"):
        PositionClassification()(FixedLogits(torch.zeros(1, 3, 4)), batch_of([[I, 9, I]]))
    with pytest.raises(DataFormatError, match="per-position label -3"):
        check_position_labels(torch.tensor([[I, -3]]), 4)
    check_position_labels(torch.tensor([[I, I]]), 4)


def test_collate_pads_per_position_targets_with_the_ignore_index():
    items = [
        {"inputs": torch.tensor([5, 6, 7]), "target": torch.tensor([I, I, 6])},
        {"inputs": torch.tensor([5, 6]), "target": torch.tensor([7, I])},
    ]
    batch = collate(items)
    assert batch["targets"].tolist() == [[I, I, 6], [7, I, I]]
    assert batch["inputs"].tolist() == [[5, 6, 7], [5, 6, 0]] and batch["lengths"].tolist() == [3, 2]
    # class labels and regression targets stack as before
    assert collate([{"inputs": torch.tensor([5]), "target": torch.tensor(2)}] * 2)["targets"].shape == (2,)
    assert collate([{"inputs": torch.tensor([5]), "target": torch.tensor([0.5, 1.0])}] * 2)["targets"].shape == (2, 2)


def test_the_task_selects_the_objective_and_head():
    mqar = load_task("mqar", vocab_size=16, seq_len=16, n_pairs=2, n_train=4, n_val=4, n_test=4)
    objective, token_head = make_objective("supervised", mqar, ObjectiveConfig())
    assert isinstance(objective, PositionClassification) and objective.causal and token_head is None
    assert supervised_head(mqar.spec) == ("tokens", 21)
    copying = load_task("selective-copying", vocab_size=6, seq_len=8, n_tokens=2, n_train=4, n_val=4, n_test=4)
    assert not make_objective("supervised", copying, ObjectiveConfig())[0].causal
    recall = load_task("associative-recall", vocab_size=16, seq_len=8, n_pairs=2, n_train=4, n_val=4, n_test=4)
    assert type(make_objective("supervised", recall, ObjectiveConfig())[0]).__name__ == "Classification"
    assert supervised_head(recall.spec) == ("classify", 8)


@pytest.mark.parametrize(
    "task, options",
    [
        ("mqar", dict(vocab_size=16, seq_len=16, n_pairs=2)),
        ("selective-copying", dict(vocab_size=6, seq_len=12, n_tokens=3)),
        ("associative-recall", dict(vocab_size=16, seq_len=8, n_pairs=2)),
    ],
)
def test_self_pretraining_reads_the_inputs_of_the_generated_tasks(task, options):
    data = load_task(task, n_train=4, n_val=4, n_test=4, **options)
    batch = data.collate([data.train[i] for i in range(4)])
    torch.manual_seed(0)
    cfg = ModelConfig(block="simple", primitive="s4d", n_layers=1, d_model=8, d_state=4, direction="causal")
    for kind in ("causal", "masked"):
        objective, head = make_objective(kind, data, ObjectiveConfig())
        assert head == data.vocab_size
        model = build_model(cfg, input_kind="tokens", vocab_size=data.vocab_size, head="tokens", n_out=head)
        out = objective(model, batch)
        assert torch.isfinite(out.loss)
        if isinstance(objective, NextTokenPrediction):
            assert out.sums["count"].item() == 4 * (options["seq_len"] - 1)  # every next input, no answer mask
        else:
            assert isinstance(objective, MaskedPrediction) and out.sums["count"].item() >= 4
