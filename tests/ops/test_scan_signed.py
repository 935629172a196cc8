"""The selective scan with eigenvalues in [-1, 1] (decay 2 exp(delta A) - 1, Grazzi et al. 2025):
the signed recurrence's hand-written backward against autograd through a loop, against the chunked
log-space scan where every decay is positive, and the whole scan against the reference in float64
(values and gradients of every input, every layout of B and C, segments shorter than the length,
an initial state), with its errors."""

from __future__ import annotations

import pytest
import torch

from longrange.ops.scan import selective_scan_ref
from longrange.ops.scan.chunked import linear_scan
from longrange.ops.scan.signed import selective_scan_signed, signed_linear_scan

F64 = dict(dtype=torch.float64)


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), **F64)


def loop(decay, inputs, h0):
    h, out = h0, []
    for t in range(inputs.shape[0]):
        h = decay[t] * h + inputs[t]
        out.append(h)
    return torch.stack(out)


def test_signed_linear_scan_matches_a_loop_in_values_and_gradients():
    decay = torch.rand(9, 3, 4, generator=torch.Generator().manual_seed(1), **F64) * 2 - 1  # (-1, 1)
    inputs, h0 = rand(9, 3, 4, seed=2), rand(3, 4, seed=3)
    assert (decay < 0).any()
    leaves = [t.clone().requires_grad_() for t in (decay, inputs, h0)]
    ours = signed_linear_scan(*leaves)
    proj = rand(*ours.shape, seed=4)
    grads = torch.autograd.grad((ours * proj).sum(), leaves)
    ref_leaves = [t.clone().requires_grad_() for t in (decay, inputs, h0)]
    ref = loop(*ref_leaves)
    ref_grads = torch.autograd.grad((ref * proj).sum(), ref_leaves)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-12, atol=1e-12)


def test_signed_linear_scan_with_positive_decays_is_the_log_space_scan():
    decay = torch.rand(11, 2, 5, generator=torch.Generator().manual_seed(5), **F64) * 0.9 + 0.05
    inputs = rand(11, 2, 5, seed=6)
    torch.testing.assert_close(
        signed_linear_scan(decay, inputs), linear_scan(decay.log(), inputs), rtol=1e-10, atol=1e-10
    )


def test_signed_linear_scan_errors_name_the_shapes():
    with pytest.raises(ValueError, match=r"decay \(3, 2\) and inputs \(3, 4\) differ in shape"):
        signed_linear_scan(rand(3, 2), rand(3, 4))
    with pytest.raises(ValueError, match=r"h0 must have shape \(4,\), got \(2,\)"):
        signed_linear_scan(rand(3, 4), rand(3, 4), rand(2))


def make_inputs(b=2, d=4, n=3, l=13, layout="shared", seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, **F64)  # noqa: E731
    bc = {"time_invariant": (d, n), "shared": (b, n, l), "grouped": (b, 2, n, l)}[layout]
    return dict(
        u=r(b, d, l),
        delta=r(b, d, l),
        A=-(torch.rand(d, n, generator=g, **F64) * 3 + 0.1),  # with softplus(delta) up to ~3: decays of both signs
        B=r(*bc),
        C=r(*bc),
        D=r(d),
        z=r(b, d, l),
        delta_bias=r(d),
        initial_state=r(b, d, n),
    )


@pytest.mark.parametrize("layout", ["time_invariant", "shared", "grouped"])
@pytest.mark.parametrize("segment", [1, 4, 64])
def test_selective_scan_signed_matches_the_reference(layout, segment):
    inputs = make_inputs(layout=layout, l=13)

    def run(fn, leaves, **kw):
        return fn(**leaves, delta_softplus=True, return_last_state=True, **kw)

    leaves = {k: v.clone().requires_grad_() for k, v in inputs.items()}
    out, last = run(selective_scan_signed, leaves, segment=segment)
    ref_leaves = {k: v.clone().requires_grad_() for k, v in inputs.items()}
    ref_out, ref_last = run(selective_scan_ref, ref_leaves, negative_eigenvalues=True)
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(last, ref_last, rtol=1e-10, atol=1e-10)
    p, q = rand(*out.shape, seed=7), rand(*last.shape, seed=8)
    grads = torch.autograd.grad((out * p).sum() + (last * q).sum(), list(leaves.values()))
    ref_grads = torch.autograd.grad((ref_out * p).sum() + (ref_last * q).sum(), list(ref_leaves.values()))
    for name, g, r in zip(leaves, grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-9, msg=lambda m, name=name: f"{name}: {m}")


def test_the_decays_take_both_signs_and_differ_from_mambas():
    inputs = make_inputs(l=7)
    del inputs["initial_state"]
    signed = selective_scan_signed(**inputs, delta_softplus=True)
    assert not torch.allclose(signed, selective_scan_ref(**inputs, delta_softplus=True))
    dt = torch.nn.functional.softplus(inputs["delta"] + inputs["delta_bias"][:, None])
    decay = 2 * torch.exp(dt[..., None] * inputs["A"][:, None, :]) - 1
    assert (decay < 0).any() and (decay > 0).any()


def test_a_decay_of_minus_one_flips_the_state_at_every_step():
    """One channel, one state, decay 2 exp(delta A) - 1 = -1 in the limit delta A -> -inf: the state
    alternates in sign, the mechanism of parity."""
    l = 6
    u = torch.ones(1, 1, l, **F64)
    delta = torch.full((1, 1, l), 1e3, **F64)
    A = torch.tensor([[-1.0]], **F64)
    B = torch.zeros(1, 1, l, **F64)
    B[..., 0] = 1e-3  # one write at the start: h_0 = delta * B * u = 1
    C = torch.ones(1, 1, l, **F64)
    y = selective_scan_signed(u, delta, A, B, C)[0, 0]
    torch.testing.assert_close(y, torch.tensor([(-1.0) ** t for t in range(l)], **F64))


def test_selective_scan_signed_checks_its_arguments():
    inputs = make_inputs(l=5)
    with pytest.raises(ValueError, match="segment must be >= 1, got 0"):
        selective_scan_signed(**inputs, segment=0)
    with pytest.raises(ValueError, match="delta"):
        selective_scan_signed(**{**inputs, "delta": rand(2, 4, 6)})
