"""The memory an evaluation needs: measured by counting tensor storages, extrapolated in the length,
and held to a budget (smaller batches, or a refusal naming the need and the budget)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from longrange.errors import ConfigError
from longrange.models.config import ModelConfig
from longrange.models.model import build_model
from longrange.train.memory import (
    BUDGET_ENV,
    MARGIN,
    Budget,
    MemoryBudgetError,
    TensorMemory,
    fit_need,
    forward_peak,
    measure_need,
    memory_budget,
    parse_bytes,
)

TOKENS = {"input_kind": "tokens", "vocab_size": 12, "kind": "classify"}


def test_parse_bytes():
    assert parse_bytes("8GiB") == 8 * 2**30 and parse_bytes("512MB") == 512 * 10**6
    assert parse_bytes("1.5 KiB") == 1536 and parse_bytes("2e3") == 2000 and parse_bytes(4096) == 4096
    for bad in ("8 parsecs", "GiB", "-1GiB", "0"):
        with pytest.raises(ConfigError, match="--memory-budget"):
            parse_bytes(bad)


def test_budget_from_the_argument_the_environment_or_the_free_memory(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setenv(BUDGET_ENV, "1GiB")
    assert memory_budget(cpu) == Budget(2**30, f"${BUDGET_ENV}")
    assert memory_budget(cpu, "2GiB") == Budget(2 * 2**30, "--memory-budget")
    monkeypatch.delenv(BUDGET_ENV)
    assert "free" in memory_budget(cpu).source or "default" in memory_budget(cpu).source


def test_tensor_memory_counts_storages_once_and_releases_them():
    with TensorMemory() as meter:
        a = torch.ones(1000)  # 4000 bytes
        view = a[:500].view(10, 50)  # a view: no new storage
        b = torch.ones(250)  # 1000 bytes: the peak is 5000
        del b
        c = torch.ones(100)  # 400 bytes, after b was freed
    assert meter.peak == 5000 and view.shape == (10, 50) and c.numel() == 100
    assert meter.now == 4400


class DenseScores(nn.Module):
    """A toy model with an (L, L) temporary, as attention that materialises its scores."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(12, 8)

    def forward(self, inputs, lengths=None, inputs2=None, lengths2=None):
        x = self.embed(inputs)
        scores = (x @ x.transpose(1, 2)).softmax(-1)
        return (scores @ x).mean(1)


def test_a_quadratic_need_is_extrapolated_and_refused_beyond_the_budget():
    model = DenseScores()
    need = fit_need([(n, forward_peak(model, TOKENS, n)) for n in (128, 256, 512)])
    assert need.c > 0
    actual = forward_peak(model, TOKENS, 2048)
    assert need.counted(2048) == pytest.approx(actual, rel=0.05)
    assert need.per_sequence(2048) == int(MARGIN * need.counted(2048))
    assert need.batch_size(2048, Budget(10 * need.per_sequence(2048), "test"), most=64) == 10
    with pytest.raises(
        MemoryBudgetError,
        match=r"needs about .* per sequence of length 2048 \(of which .* grow with the "
        r"square of the length: dense attention scores\), more than the memory "
        r"budget of 1\.0 MiB \(test\).*--memory-budget SIZE",
    ):
        need.batch_size(2048, Budget(2**20, "test"), most=64)


@pytest.mark.parametrize(
    "block,primitive", [("simple", "s4d"), ("simple", "dlr"), ("mamba", "s6"), ("transformer", "attention")]
)
def test_the_need_of_each_model_grows_linearly_and_extrapolates(block, primitive):
    """State-space layers (and attention through PyTorch's fused kernels) allocate a fixed number of
    (L, width) activations: the need counted at 1024, 2048 and 4096 positions predicts the need at 8192."""
    torch.manual_seed(0)
    cfg = ModelConfig(
        block=block, primitive=primitive, n_layers=2, d_model=16, d_state=8, n_heads=2, direction="causal"
    )
    model = build_model(cfg, input_kind="tokens", head="classify", n_out=4, vocab_size=12).eval()
    need = measure_need(model, TOKENS, 8192)
    assert [n for n, _ in need.measured] == [1024, 2048, 4096] and need.c == 0
    actual = forward_peak(model, TOKENS, 8192)
    assert actual <= need.counted(8192) <= 1.1 * actual
    assert measure_need(model, TOKENS, 300).measured == ((300, forward_peak(model, TOKENS, 300)),)


def test_fit_with_one_or_two_points():
    assert fit_need([(100, 1000)]).counted(400) == 4000
    two = fit_need([(100, 1500), (200, 2500)])
    assert (two.a, two.b, two.c) == (500.0, 10.0, 0.0) and two.counted(1000) == 10500
    # Three points on a line (a kink at the shortest does not make a square term): the line through the longest two.
    kinked = fit_need([(1000, 900_000), (2000, 2_000_000), (4000, 4_000_000)])
    assert kinked.c == 0 and kinked.b == 1000 and kinked.counted(8000) == 8_000_000
    square = fit_need([(n, 10 * n + n * n) for n in (1000, 2000, 4000)])
    assert square.c == pytest.approx(1.0) and square.counted(8000) == pytest.approx(80_000 + 64_000_000)
