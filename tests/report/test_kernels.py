"""Kernel decay analysis: shapes, known decays of S4D and DLR, layers without kernels, plots."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from longrange.layers.base import SequencePrimitive
from longrange.layers.bidirectional import FlipSum
from longrange.layers.dlr import DLR
from longrange.models.config import ModelConfig
from longrange.models.model import build_model
from longrange.report.kernels import centre_of_mass, cutoff, envelope, kernel_decay, layer_kernel
from longrange.report.plots import kernel_decay_plot

L = 128


def tiny(primitive: str, direction: str = "causal", block: str = "simple", n_layers: int = 2, **kw):
    cfg = ModelConfig(
        block=block, primitive=primitive, n_layers=n_layers, d_model=4, d_state=2, direction=direction, n_heads=2, **kw
    )
    return build_model(cfg, input_kind="tokens", head="classify", n_out=3, vocab_size=10).double()


def expected_com(r: float, length: int = L) -> float:
    lags = np.arange(length)
    return float((lags * r**lags).sum() / (r**lags).sum())


def set_s4d_real_mode(layer, rates: list[float], dts: list[float]) -> None:
    """One real mode per channel: A = -rate (imaginary part 0), B = 1, C = 1, Δ = dt."""
    with torch.no_grad():
        layer.log_dt.copy_(torch.tensor(dts, dtype=torch.float64).log())
        layer.A_real.copy_(torch.tensor(rates, dtype=torch.float64).log().unsqueeze(-1))  # Re A = -exp(raw)
        layer.A_imag.zero_()
        layer.B.zero_()
        layer.B[..., 0] = 1.0
        layer.C.zero_()
        layer.C[..., 0] = 1.0


def test_shapes_and_envelope_normalisation():
    model = tiny("s4d")
    rep = kernel_decay(model, L)
    assert rep.has_kernels and rep.without_kernel == [] and rep.message() == ""
    assert [(p.layer, p.direction, p.primitive) for p in rep.profiles] == [(0, "forward", "S4D"), (1, "forward", "S4D")]
    assert rep.profiles[0].name == "backbone.blocks.0.mixer"
    for p in rep.profiles:
        assert p.envelope.shape == (L,) and p.envelope.dtype == np.float64
        assert p.envelope.max() == pytest.approx(1.0) and (p.envelope >= 0).all()
        assert 0.0 <= p.centre_of_mass < L


def test_s4d_with_known_dt_and_A_gives_the_known_decay():
    model = tiny("s4d")
    a, dt = 0.5, 0.1  # |K_l| ∝ exp(-a·dt·l): r = exp(-0.05)
    for layer in model.backbone.mixers():
        set_s4d_real_mode(layer, [a] * 4, [dt] * 4)
    r = math.exp(-a * dt)
    rep = kernel_decay(model, L)
    for p in rep.profiles:
        np.testing.assert_allclose(p.envelope, r ** np.arange(L), rtol=1e-10)
        assert p.centre_of_mass == pytest.approx(expected_com(r), rel=1e-10)
        # r^l < 0.1  <=>  l > ln 10 / (a·dt) = 46.05
        assert p.cutoff == 47


def test_envelope_is_the_channel_mean_of_abs_K_then_normalised():
    model = tiny("s4d", n_layers=1)
    rates, dts = [0.5, 2.0, 1.0, 0.2], [0.1, 0.05, 0.3, 0.01]
    set_s4d_real_mode(model.backbone.mixers()[0], rates, dts)
    # ZOH: B̄ = (exp(Δ A) - 1) / A, so K_l = 2 · (1 - exp(-aΔ)) / a · exp(-aΔ l).
    lags = np.arange(L)
    K = np.stack([2 * (1 - math.exp(-a * d)) / a * np.exp(-a * d * lags) for a, d in zip(rates, dts)])
    env = K.mean(axis=0) / K.mean(axis=0).max()
    (p,) = kernel_decay(model, L).profiles
    np.testing.assert_allclose(p.envelope, env, rtol=1e-10)
    assert p.centre_of_mass == pytest.approx(float((lags * env).sum() / env.sum()), rel=1e-10)
    assert p.cutoff == int(np.nonzero(env < 0.1)[0][0])


def test_bidirectional_dlr_has_forward_and_backward_profiles_with_known_decay():
    model = tiny("dlr", direction="bidirectional")
    a = 0.03
    for layer in model.backbone.mixers():
        with torch.no_grad():
            layer.nu.fill_(math.sqrt(a))  # Λ = exp(-ν² + iθ) = exp(-a)
            layer.theta.zero_()
            layer.C.zero_()
            layer.C[..., 0] = 1.0
    rep = kernel_decay(model, L)
    assert [(p.layer, p.direction) for p in rep.profiles] == [
        (0, "forward"),
        (0, "backward"),
        (1, "forward"),
        (1, "backward"),
    ]
    for p in rep.profiles:
        np.testing.assert_allclose(p.envelope, np.exp(-a * np.arange(L)), rtol=1e-10)
        assert p.centre_of_mass == pytest.approx(expected_com(math.exp(-a)), rel=1e-10)
        assert p.cutoff == math.ceil(math.log(10) / a)  # 76.75 -> 77


def test_flipsum_of_kernel_primitives_reads_both_directions():
    fwd, bwd = DLR(4, d_state=2).double(), DLR(4, d_state=2).double()
    K = layer_kernel(FlipSum(fwd, bwd), 16)
    assert K.shape == (2, 4, 16)
    torch.testing.assert_close(K[0], fwd.kernel(16)[0])
    torch.testing.assert_close(K[1], bwd.kernel(16)[0])


@pytest.mark.parametrize(
    "primitive, block, kind",
    [("attention", "simple", "Attention"), ("s6", "mamba", "S6"), ("attention", "transformer", "")],
)
def test_models_without_kernels_are_reported_not_errors(primitive, block, kind):
    model = tiny(primitive, block=block)
    rep = kernel_decay(model, 32)
    assert not rep.has_kernels and rep.profiles == []
    assert len(rep.without_kernel) == 2
    assert "no convolution kernels" in rep.message() and kind in rep.message()
    assert kernel_decay_plot({"run": ("scratch", rep)}, "/nonexistent/never-written.png") is None


def test_mamba_block_with_s4d_reports_each_branch():
    model = tiny("s4d", direction="bidirectional", block="mamba", n_layers=1)
    rep = kernel_decay(model, 32)
    assert [p.name for p in rep.profiles] == ["backbone.blocks.0.branches.0.ssm", "backbone.blocks.0.branches.1.ssm"]


class _BadKernel(SequencePrimitive):
    def __init__(self, shape):
        super().__init__()
        self.d_model, self.shape = 4, shape

    def kernel(self, L):
        return torch.ones(*self.shape, L)

    def forward(self, x, mask=None):
        return x


def test_kernel_shapes_accepted_and_rejected():
    assert layer_kernel(_BadKernel((4,)), 8).shape == (1, 4, 8)  # (H, L) is one channel
    assert layer_kernel(_BadKernel((2, 4)), 8).shape == (2, 4, 8)
    with pytest.raises(ValueError, match=r"_BadKernel.kernel\(8\) has shape \(3, 4, 8\)"):
        layer_kernel(_BadKernel((3, 4)), 8)
    with pytest.raises(ValueError, match="positive integer"):
        kernel_decay(tiny("s4d"), 0)
    with pytest.raises(TypeError, match="backbone.mixers"):
        kernel_decay(torch.nn.Linear(2, 2), 8)


def test_summaries_on_handmade_envelopes():
    env = np.array([0.2, 1.0, 0.5, 0.05, 0.3, 0.0])
    assert cutoff(env) == 3  # after the peak, not the 0.2 before it
    assert cutoff(env, threshold=0.01) == 5
    assert cutoff(np.ones(4)) is None  # never falls below the threshold
    assert centre_of_mass(env) == pytest.approx((1 + 1.0 + 0.15 + 1.2) / 2.05)
    zero = envelope(torch.zeros(1, 3, 5))
    assert (zero == 0).all() and math.isnan(centre_of_mass(zero[0])) and cutoff(zero[0]) is None
    with pytest.raises(ValueError, match="threshold"):
        cutoff(env, threshold=1.5)


def test_kernel_decay_plot_writes_a_png(tmp_path):
    scratch, spt = tiny("s4d"), tiny("s4d")
    for layer in spt.backbone.mixers():
        set_s4d_real_mode(layer, [2.0] * 4, [0.1] * 4)
    reports = {
        "S4D s0": ("scratch", kernel_decay(scratch, 64)),
        "S4D + masked SPT s0": ("masked-spt", kernel_decay(spt, 64)),
    }
    path = kernel_decay_plot(reports, tmp_path / "k.png", title="listops: S4D, ")
    with Image.open(path) as im:
        assert im.format == "PNG"
        im.verify()


def test_cli_kernels_section(tmp_path, monkeypatch, capsys):
    """``--kernels`` loads each final run's model (here: built directly) and reports its decay."""
    import longrange.train.trained as runs_module
    from longrange.cli import main

    models = {}
    for regime, primitive in (("scratch", "s4d"), ("masked-spt", "s6")):
        d = tmp_path / regime
        d.mkdir()
        (d / "config.yaml").write_text(json.dumps({"task": {"name": "listops", "options": {"seq_len": 48}}}))
        (d / "summary.json").write_text(
            json.dumps(
                {
                    "task": "listops",
                    "label": "M",
                    "regime": regime,
                    "stage": "train",
                    "seed": 0,
                    "metric": "accuracy",
                    "higher_is_better": True,
                    "best_val": {"accuracy": 0.5},
                    "test": {"accuracy": 0.5},
                    "steps": 1,
                    "params": {"total": 1, "in_primitives": 1},
                    "pretrain_run": None,
                    "seconds": 1.0,
                }
            )
        )
        models[d.resolve()] = tiny(primitive, block="simple" if primitive == "s4d" else "mamba")
    monkeypatch.setattr(runs_module, "load_model", lambda run_dir: models[run_dir.resolve()])
    assert main(["report", str(tmp_path), "--kernels"]) == 0
    report = (tmp_path / "report.md").read_text()
    assert "## Convolution kernel decay" in report
    assert "| M | listops | 0 | 48 | 0 (S4D) | forward |" in report  # L from the task's seq_len
    assert "no convolution kernels" in report and "(S6)" in report
    with Image.open(tmp_path / "kernels_listops_m.png") as im:
        assert im.format == "PNG"


def test_kernel_lines_average_the_seeds_of_a_row_and_name_rows_not_runs():
    """The plot's legend has one entry per row and direction (n seeds), its thick line the mean envelope."""
    from longrange.report.plots import kernel_lines

    a, b = tiny("s4d"), tiny("s4d")
    for layer in b.backbone.mixers():
        set_s4d_real_mode(layer, [2.0] * 4, [0.1] * 4)
    ra, rb = kernel_decay(a, 32), kernel_decay(b, 32)
    panels = kernel_lines({"S4D": ("scratch", [ra, rb]), "S4D + masked SPT": ("masked-spt", rb)})
    assert sorted(panels) == sorted({p.layer for p in ra.profiles})
    for layer, lines in panels.items():
        assert [line.label for line in lines if line.direction == "forward"] == ["S4D, n=2", "S4D + masked SPT"]
        first = next(line for line in lines if line.label == "S4D, n=2")
        ea = next(p.envelope for p in ra.profiles if p.layer == layer and p.direction == "forward")
        eb = next(p.envelope for p in rb.profiles if p.layer == layer and p.direction == "forward")
        np.testing.assert_allclose(first.mean, (ea + eb) / 2)
        assert len(first.runs) == 2


def test_kernel_plot_rows_keep_the_subsets_of_a_sweep_apart(tmp_path, monkeypatch):
    """In a data-fraction sweep, each subset is its own line (its seeds averaged), never one mean over subsets."""
    import longrange.report.plots as plots_module
    import longrange.train.trained as runs_module
    from longrange.report import write_report

    models = {}
    for subset in (0.1, 0.5):
        for seed in (0, 1):
            d = tmp_path / f"subset{subset}" / f"seed{seed}"
            d.mkdir(parents=True)
            (d / "config.yaml").write_text(
                json.dumps({"task": {"name": "listops", "options": {"seq_len": 16}, "train_subset": subset}})
            )
            (d / "summary.json").write_text(
                json.dumps(
                    {
                        "task": "listops",
                        "label": "M",
                        "regime": "scratch",
                        "stage": "train",
                        "seed": seed,
                        "metric": "accuracy",
                        "higher_is_better": True,
                        "best_val": {"accuracy": 0.5},
                        "test": {"accuracy": 0.5},
                        "steps": 1,
                        "params": {"total": 1, "in_primitives": 1},
                        "pretrain_run": None,
                        "seconds": 1.0,
                        "train_subset": subset,
                        "train_size": 10,
                    }
                )
            )
            models[d.resolve()] = tiny("s4d")
    monkeypatch.setattr(runs_module, "load_model", lambda run_dir: models[run_dir.resolve()])
    seen = {}
    monkeypatch.setattr(plots_module, "kernel_decay_plot", lambda rows, path, title="": seen.update(rows))
    write_report([tmp_path], out_dir=tmp_path, kernels=True)
    assert sorted(seen) == ["M, subset 0.1", "M, subset 0.5"]
    assert all(regime == "scratch" and len(reps) == 2 for regime, reps in seen.values())
