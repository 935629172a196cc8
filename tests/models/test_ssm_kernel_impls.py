"""One training step of small S4 and S4D models with each implementation of the SSM-kernel products
that can run here: loss, gradients and updated parameters agree within float32 tolerance.

``chunked`` (the PyTorch products the models ran before the fused kernels) is the baseline; the
Triton kernels run in Triton's interpreter (``TRITON_INTERPRET=1``) when triton imports.
"""

from __future__ import annotations

import interpreter
import pytest
import torch

from longrange.models.config import ModelConfig
from longrange.models.model import build_model
from longrange.ops import ssm_kernels, used

CONFIGS = {
    "mamba-s4d": ModelConfig(block="mamba", primitive="s4d", n_layers=2, d_model=8, d_state=6),
    "simple-s4d-bi": ModelConfig(
        block="simple", primitive="s4d", n_layers=1, d_model=8, d_state=6, direction="bidirectional"
    ),
    # l_max: the length of the inputs (S4 computes its kernel at l_max and truncates it)
    "mamba-s4": ModelConfig(
        block="mamba", primitive="s4", n_layers=2, d_model=8, d_state=6, primitive_options={"l_max": 24}
    ),
    "simple-s4-bi": ModelConfig(
        block="simple",
        primitive="s4",
        n_layers=1,
        d_model=8,
        d_state=6,
        direction="bidirectional",
        primitive_options={"l_max": 24},
    ),
}


def _impls() -> list[str]:
    impls = [i for i in ssm_kernels.available_impls("cauchy", "cpu") if i not in ("chunked", "pykeops")]
    try:
        from longrange.ops.ssm_kernels import triton as ssm_triton

        if ssm_triton._kernel_module() is not None and "triton" not in impls:
            impls.insert(0, "triton")
    except ImportError:  # pragma: no cover
        pass
    return impls


def train_step(cfg: ModelConfig, impl: str) -> dict[str, torch.Tensor]:
    """Loss, gradients and parameters after one AdamW step, both products forced to ``impl``."""
    torch.manual_seed(0)
    model = build_model(cfg, input_kind="numeric", head="classify", n_out=3, d_input=2)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 24, 2, generator=g)
    lengths = torch.tensor([24, 20, 17, 24])
    y = torch.tensor([0, 2, 1, 1])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    used.reset()
    with ssm_kernels.default_impl(ssm_kernels.OPS, impl):
        loss = torch.nn.functional.cross_entropy(model(x, lengths), y)
        loss.backward()
    ran = {
        op: i for op, i in used.kernels().items() if op in ssm_kernels.OPS
    }  # a Mamba block also runs its convolution
    assert ran == ({"cauchy": impl} if cfg.primitive == "s4" else {"vandermonde": impl}), ran
    out = {"loss": loss.detach()}
    out.update({f"grad {n}": p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    optimizer.step()
    out.update({f"param {n}": p.detach().clone() for n, p in model.named_parameters()})
    return out


def _cases() -> list:
    """(name, impl) for every model and implementation; the Mamba-S4 block in Triton's interpreter
    (about 27 s, the suite's slowest) runs with ``-m slow``: the bidirectional Simple-S4 case takes
    the same Cauchy kernel through a training step."""
    slow = {("mamba-s4", "triton")}
    return [
        pytest.param(name, impl, marks=[pytest.mark.slow] if (name, impl) in slow else [], id=f"{name}-{impl}")
        for impl in _impls()
        for name in CONFIGS
    ]


@pytest.mark.parametrize("name, impl", _cases())
def test_one_training_step_agrees_with_the_chunked_products(name, impl, monkeypatch):
    if impl == "triton":
        interpreter.use(monkeypatch)
    expected = train_step(CONFIGS[name], "chunked")
    got = train_step(CONFIGS[name], impl)
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        scale = value.abs().max().item()
        err = (got[key] - value).abs().max().item()
        assert err <= 1e-4 * scale + 1e-6, f"{name} {impl}: {key} differs by {err:.3g} (max {scale:.3g})"
