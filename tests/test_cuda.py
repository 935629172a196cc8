"""The suite's CUDA checks: every op (each implementation available there), primitive, block and
model family on the GPU against float64 CPU references (values and gradients), bf16 autocast,
recurrent step == parallel forward, and a short training run per model family.

Skipped without CUDA or with ``--device cpu`` (see ``tests/conftest.py``). The GPU computes in
float32 with TF32 turned off, so the tolerances are float32 ones, relative to the size of each
compared tensor. ``LONGRANGE_TEST_CUDA_DRY_RUN=1`` runs the module on the CPU instead, to check the
tests themselves on a machine without a GPU.
"""

from __future__ import annotations

import copy
import math
import os

import pytest
import torch

from longrange import _optional
from longrange.data.batch import padding_mask
from longrange.models.backbone import make_block, make_primitive
from longrange.models.config import ModelConfig
from longrange.models.model import build_model
from longrange.objectives.supervised import Classification
from longrange.ops import conv, ssm_kernels
from longrange.ops.fftconv import fft_conv, fft_conv_ref
from longrange.ops.scan import dispatch as scan
from longrange.ops.scan.numba import numba_available
from longrange.ops.ssm_kernels import (
    cauchy,
    cauchy_ref,
    diag_ssm_kernel,
    diag_ssm_kernel_ref,
    dplr_ssm_kernel,
    dplr_ssm_kernel_ref,
)
from longrange.train import train

DRY_RUN = os.environ.get("LONGRANGE_TEST_CUDA_DRY_RUN") == "1"


@pytest.fixture(scope="module")
def dev(request) -> torch.device:
    if DRY_RUN:
        return torch.device("cpu")
    return request.getfixturevalue("cuda_device")


@pytest.fixture(autouse=True)
def exact_float32(dev):
    """TF32 off (matmuls and cuDNN convolutions), so that the GPU computes in true float32."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def assert_near(actual: torch.Tensor, expected: torch.Tensor, rel: float, what: str = "") -> None:
    """max |actual - expected| <= rel * max |expected| (+ a floor), compared on the CPU in float64."""
    a = actual.detach().cpu().to(torch.complex128 if actual.is_complex() else torch.float64)
    e = expected.detach().cpu().to(a.dtype)
    assert a.shape == e.shape, f"{what}: shape {tuple(a.shape)} != {tuple(e.shape)}"
    assert torch.isfinite(a).all(), f"{what}: not finite"
    scale = e.abs().max().item() if e.numel() else 0.0
    err = (a - e).abs().max().item() if e.numel() else 0.0
    assert err <= rel * scale + 1e-6, f"{what}: max error {err:.3g} > {rel:g} x max {scale:.3g}"


def _low(t: torch.Tensor, dev: torch.device) -> torch.Tensor:
    return t.detach().to(dev, torch.complex64 if t.is_complex() else torch.float32).requires_grad_()


def compare_op(fn, ref, inputs, dev, rel=2e-4, grad_rel=2e-3, what="") -> None:
    """fn on float32 copies of ``inputs`` on ``dev`` against ref on the float64 CPU values."""
    low = [_low(t, dev) for t in inputs]
    high = [t.detach().cpu().to(torch.complex128 if t.is_complex() else torch.float64).requires_grad_() for t in low]
    out, expected = fn(*low), ref(*high)
    assert out.device.type == dev.type, what
    assert_near(out, expected, rel, what)
    g = torch.randn(expected.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    if expected.is_complex():
        g = torch.complex(g, g.roll(1, -1))
    grads = torch.autograd.grad(out, low, g.to(dev, out.dtype), allow_unused=True)
    grads_ref = torch.autograd.grad(expected, high, g, allow_unused=True)
    for i, (a, b) in enumerate(zip(grads, grads_ref)):
        assert (a is None) == (b is None), f"{what} gradient {i}: computed on one side only"
        if a is not None:
            assert_near(a, b, grad_rel, f"{what} gradient {i}")


# --------------------------------------------------------------------------------------------
# Ops
# --------------------------------------------------------------------------------------------


def scan_impls(dev: torch.device) -> list[str]:
    """The selective-scan implementations that can run on ``dev``."""
    impls = ["auto", "chunked", "ref"]
    if dev.type == "cuda":
        if _optional.selective_scan_cuda_fn is not None:
            impls.append("cuda")
        if scan._triton_scan()[0] is not None:
            impls.append("triton")
    elif numba_available():
        impls.append("numba")
    return impls


def _scan_inputs(layout: str, b=2, d=8, n=4, l=37, groups=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    shape = {"time_invariant": (d, n), "shared": (b, n, l), "grouped": (b, groups, n, l)}[layout]
    return [
        r(b, d, l),
        r(b, d, l),
        -(torch.rand(d, n, generator=g, dtype=torch.float64) + 0.1),
        r(*shape),
        r(*shape),
        r(d),
        r(b, d, l),
        r(d),
        r(b, d, n),
    ]


@pytest.mark.parametrize("layout", ["time_invariant", "shared", "grouped"])
@pytest.mark.parametrize("with_state", [False, True])
def test_selective_scan_every_impl(dev, layout, with_state):
    inputs = _scan_inputs(layout)
    for impl in scan_impls(dev):
        if with_state and impl == "cuda":
            continue  # mamba_ssm's kernel takes no initial state

        def run(u, delta, A, B, C, D, z, bias, h0, impl=impl):
            y, last = scan.selective_scan(
                u,
                delta,
                A,
                B,
                C,
                D,
                z,
                bias,
                delta_softplus=True,
                return_last_state=True,
                initial_state=h0 if with_state else None,
                impl=impl if u.dtype != torch.float64 else "ref",
            )
            # mamba_ssm's backward takes no gradient of the last state
            return y if impl == "cuda" else torch.cat([y.flatten(), last.flatten().to(y.dtype)])

        compare_op(run, run, inputs, dev, what=f"selective_scan impl={impl} {layout}")


def test_selective_scan_auto_picks_a_gpu_implementation(dev):
    if dev.type != "cuda":
        pytest.skip("dispatch on CUDA only")
    expected = (
        "cuda"
        if _optional.selective_scan_cuda_fn is not None
        else ("triton" if scan._triton_scan()[0] is not None else "chunked")
    )
    assert scan.auto_impl(dev) == expected


@pytest.mark.parametrize("activation", [None, "silu"])
def test_causal_conv1d_every_impl(dev, activation):
    g = torch.Generator().manual_seed(1)
    inputs = [
        torch.randn(2, 8, 33, generator=g, dtype=torch.float64),
        torch.randn(8, 4, generator=g, dtype=torch.float64),
        torch.randn(8, generator=g, dtype=torch.float64),
    ]
    impls = ["auto", "torch", "ref"] + (["cuda"] if conv.auto_impl(dev) == "cuda" else [])
    for impl in impls:
        compare_op(
            lambda x, w, b, impl=impl: conv.causal_conv1d(
                x, w, b, activation, impl=impl if x.dtype != torch.float64 else "ref"
            ),
            lambda x, w, b: conv.causal_conv1d_ref(x, w, b, activation),
            inputs,
            dev,
            what=f"causal_conv1d {impl}",
        )


@pytest.mark.parametrize("two_sided", [False, True])
def test_fft_conv(dev, two_sided):
    g = torch.Generator().manual_seed(2)
    k = (
        torch.randn(2, 6, 50, generator=g, dtype=torch.float64)
        if two_sided
        else torch.randn(6, 50, generator=g, dtype=torch.float64)
    )
    inputs = [
        torch.randn(2, 6, 50, generator=g, dtype=torch.float64),
        k,
        torch.randn(6, generator=g, dtype=torch.float64),
    ]
    compare_op(fft_conv, fft_conv_ref, inputs, dev, what="fft_conv")


def test_cauchy_and_ssm_kernels(dev):
    g = torch.Generator().manual_seed(3)

    def c(*s):
        return torch.complex(
            torch.randn(*s, generator=g, dtype=torch.float64), torch.randn(*s, generator=g, dtype=torch.float64)
        )

    compare_op(cauchy, cauchy_ref, [c(3, 8), c(3, 40) + 4, c(3, 8)], dev, what="cauchy")
    H, N, L = 3, 4, 20
    dt = torch.rand(H, generator=g, dtype=torch.float64) * 0.3 + 0.05
    A = torch.complex(
        -torch.rand(H, N, generator=g, dtype=torch.float64) - 0.1, torch.randn(H, N, generator=g, dtype=torch.float64)
    )
    for method in ("zoh", "bilinear"):
        compare_op(
            lambda dt, A, B, C: diag_ssm_kernel(dt, A, B, C, L, method),
            lambda dt, A, B, C: diag_ssm_kernel_ref(dt, A, B, C, L, method),
            [dt, A, c(H, N), c(H, N)],
            dev,
            what=f"diag_ssm_kernel {method}",
        )
    Lam = torch.complex(
        -torch.rand(H, N, generator=g, dtype=torch.float64) - 0.1,
        torch.randn(H, N, generator=g, dtype=torch.float64) * 3,
    )
    P, Q = c(1, H, N) * 0.4, c(1, H, N) * 0.4
    compare_op(
        lambda *a: dplr_ssm_kernel(*a, L),
        lambda *a: dplr_ssm_kernel_ref(*a, L),
        [dt, Lam, P, Q, c(H, N), c(H, N)],
        dev,
        rel=1e-3,
        grad_rel=1e-2,
        what="dplr_ssm_kernel",
    )


def test_ssm_kernel_products_every_impl(dev):
    """Each implementation of the Vandermonde and Cauchy products that can run on the device (the
    Triton kernels, pykeops, chunked PyTorch, the reference) against the float64 references."""
    g = torch.Generator().manual_seed(4)

    def c(*s):
        return torch.complex(
            torch.randn(*s, generator=g, dtype=torch.float64), torch.randn(*s, generator=g, dtype=torch.float64)
        )

    H, M, L = 6, 10, 300
    dt = torch.rand(H, 1, generator=g, dtype=torch.float64) * 0.09 + 0.01
    log_dA = dt * torch.complex(
        -0.5 - torch.rand(H, M, generator=g, dtype=torch.float64), torch.pi * torch.arange(M, dtype=torch.float64)
    )
    W = c(2, H, M)
    v, z, w = (
        c(4, H, 7),
        torch.complex(
            0.2 * torch.rand(H, 33, generator=g, dtype=torch.float64),
            4 * torch.randn(H, 33, generator=g, dtype=torch.float64),
        ),
        c(H, 7) - 1.5,
    )
    impls = ssm_kernels.available_impls("vandermonde", dev)
    if dev.type == "cuda":
        assert ssm_kernels.auto_impl("vandermonde", dev) == ("triton" if "triton" in impls else "chunked")
    for impl in impls:
        compare_op(
            lambda a, W, impl=impl: ssm_kernels.vandermonde_kernel(
                a, W, L, impl=impl if a.dtype != torch.complex128 else "ref"
            ),
            lambda a, W: ssm_kernels.vandermonde_kernel_ref(a, W, L),
            [log_dA, W],
            dev,
            what=f"vandermonde {impl}",
        )
    for impl in ssm_kernels.available_impls("cauchy", dev):
        for conj_pairs in (False, True):
            compare_op(
                lambda v, z, w, impl=impl: cauchy(
                    v, z, w, conj_pairs=conj_pairs, impl=impl if v.dtype != torch.complex128 else "ref"
                ),
                lambda v, z, w: cauchy_ref(v, z, w, conj_pairs),
                [v, z, w],
                dev,
                what=f"cauchy {impl} conj_pairs={conj_pairs}",
            )


# --------------------------------------------------------------------------------------------
# Primitives, blocks, models: the same weights in float64 on the CPU and float32 on the device
# --------------------------------------------------------------------------------------------


def _pair(module: torch.nn.Module, dev: torch.device) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(float64 CPU copy, float32 device copy) of ``module``, in eval mode."""
    return copy.deepcopy(module).double().eval(), copy.deepcopy(module).to(dev, torch.float32).eval()


def compare_modules(module, make_args, dev, rel=5e-4, grad_rel=5e-3, what="") -> None:
    """Outputs and parameter gradients of ``module(*make_args(dtype, device))`` on both copies."""
    ref, low = _pair(module, dev)
    out_ref = ref(*make_args(torch.float64, torch.device("cpu")))
    out = low(*make_args(torch.float32, dev))
    assert out.device.type == dev.type and out.dtype == torch.float32, what
    assert_near(out, out_ref, rel, what)
    proj = torch.randn(out_ref.shape, generator=torch.Generator().manual_seed(11), dtype=torch.float64)
    (out_ref * proj).sum().backward()
    (out * proj.to(dev, out.dtype)).sum().backward()
    grads_ref = {n: p.grad for n, p in ref.named_parameters() if p.grad is not None}
    grads = {n: p.grad for n, p in low.named_parameters() if p.grad is not None}
    assert grads.keys() == grads_ref.keys() and grads, what
    for name in grads:
        assert_near(grads[name], grads_ref[name], grad_rel, f"{what} gradient of {name}")


def _sequence_args(batch=2, length=24, d=8, seed=5, padded=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, length, d, generator=g, dtype=torch.float64)
    lengths = torch.tensor([length, length - 7][:batch])

    def make(dtype, device):
        mask = padding_mask(lengths, length).to(device) if padded else None
        return x.to(device, dtype), mask

    return make


PRIMITIVES = ["s4", "s4d", "s6", "dlr", "attention"]


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("name", PRIMITIVES)
def test_primitives(dev, name, bidirectional):
    torch.manual_seed(0)
    options = {"n_heads": 2} if name == "attention" else {}
    layer = make_primitive(name, 8, d_state=4, bidirectional=bidirectional, **options)
    compare_modules(layer, _sequence_args(), dev, what=f"{name} bidirectional={bidirectional}")


def small(**kw) -> ModelConfig:
    base = dict(block="mamba", primitive="s6", n_layers=2, d_model=8, d_state=4, n_heads=2)
    base.update(kw)
    return ModelConfig(**base)


BLOCKS = {
    "simple-s4d": small(block="simple", primitive="s4d"),
    "simple-s4-bi": small(block="simple", primitive="s4", direction="bidirectional"),
    "mamba-s6": small(),
    "mamba-s6-bi": small(direction="bidirectional"),
    "mamba-s6-placebo": small(direction="placebo"),
    "mamba-s6-rope": small(rope=True, rope_targets=("B", "C", "x")),
    "mamba-s4d-bi": small(primitive="s4d", direction="bidirectional"),
    "transformer": small(block="transformer", primitive="attention"),
    "transformer-bi-rope": small(block="transformer", primitive="attention", direction="bidirectional", rope=True),
}


@pytest.mark.parametrize("name", list(BLOCKS))
def test_blocks(dev, name):
    torch.manual_seed(1)
    compare_modules(make_block(BLOCKS[name]), _sequence_args(), dev, what=name)


FAMILIES = {
    "mamba-s6": small(),
    "mamba-s4d": small(primitive="s4d"),
    "mamba-s4": small(primitive="s4"),
    "mamba-dlr": small(primitive="dlr"),
    "mamba-s6-bi": small(direction="bidirectional"),
    "simple-s4d": small(block="simple", primitive="s4d"),
    "simple-s4": small(block="simple", primitive="s4"),
    "simple-dlr": small(block="simple", primitive="dlr"),
    "simple-s6-bi": small(block="simple", primitive="s6", direction="bidirectional"),
    "transformer": small(block="transformer", primitive="attention"),
    "transformer-bi": small(block="transformer", primitive="attention", direction="bidirectional"),
}


def _classifier(cfg: ModelConfig, head="classify", n_out=3):
    torch.manual_seed(2)
    return build_model(cfg, input_kind="numeric", head=head, n_out=n_out, d_input=2)


def _model_args(seed=6):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 20, 2, generator=g, dtype=torch.float64)
    lengths = torch.tensor([20, 13])
    return lambda dtype, device: (x.to(device, dtype), lengths.to(device))


@pytest.mark.parametrize("name", list(FAMILIES))
def test_models(dev, name):
    compare_modules(_classifier(FAMILIES[name]), _model_args(), dev, what=name)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_bf16_autocast_finite_and_close(dev, name):
    ref, low = _pair(_classifier(FAMILIES[name]), dev)
    make = _model_args()
    expected = ref(*make(torch.float64, torch.device("cpu")))
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        out = low(*make(torch.float32, dev))
    assert_near(out.float(), expected, 5e-2, f"{name} under bf16 autocast")
    out.float().sum().backward()
    for pname, p in low.named_parameters():
        assert p.grad is None or torch.isfinite(p.grad).all(), f"{name}: gradient of {pname} not finite"


@pytest.mark.parametrize("name", [n for n, cfg in FAMILIES.items() if cfg.direction == "causal"])
def test_step_equals_forward(dev, name):
    model = _classifier(FAMILIES[name], head="tokens", n_out=5).to(dev, torch.float32).eval()
    x = torch.randn(2, 16, 2, generator=torch.Generator().manual_seed(8)).to(dev)
    with torch.no_grad():
        parallel = model(x)
        state = model.default_state(2, device=dev, dtype=torch.float32)
        steps = []
        for t in range(x.shape[1]):
            y, state = model.step(x[:, t], state)
            steps.append(y)
    assert_near(torch.stack(steps, 1), parallel, 1e-4, f"{name}: step vs forward")


# --------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------


def _tiny_task(n: int, seed: int) -> list[dict]:
    """Numeric sequences of 12-24 steps, 2 channels; the class: whether channel 0 sums above 0."""
    g = torch.Generator().manual_seed(seed)
    items = []
    for _ in range(n):
        x = torch.randn(int(torch.randint(12, 25, (), generator=g)), 2, generator=g)
        items.append({"inputs": x, "target": torch.tensor(int(x[:, 0].sum() > 0))})
    return items


@pytest.mark.parametrize(
    "name,precision", [(n, "fp32") for n in FAMILIES] + [("mamba-s6", "bf16"), ("simple-s4d", "bf16")]
)
def test_short_training_run(dev, tmp_path, name, precision):
    model = _classifier(FAMILIES[name], n_out=2)
    data = {"train": _tiny_task(48, 0), "val": _tiny_task(16, 1), "test": _tiny_task(16, 2)}
    cfg = {"epochs": 2, "batch_size": 16, "lr": 3e-3, "progress": False, "log_every": 1, "precision": precision}
    summary = train(model, Classification(), data, cfg, tmp_path / name, device=dev, tensorboard=False)
    assert summary["step"] == 6
    assert all(p.device.type == dev.type for p in model.parameters())
    for split in ("final", "test"):
        assert math.isfinite(summary[split]["loss"]) and 0.0 <= summary[split]["accuracy"] <= 1.0
    assert (tmp_path / name / "checkpoints" / "best.safetensors").exists()
