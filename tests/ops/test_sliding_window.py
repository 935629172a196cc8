"""Sliding-window attention against its dense masked reference (values and gradients, float64)."""

from __future__ import annotations

import pytest
import torch

import longrange.ops.sliding_window as sw
from longrange.ops.sliding_window import sliding_window_attention, sliding_window_attention_ref, sliding_window_mask_ref

DT = torch.float64


def qkv(n=3, h=2, length=11, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, h, length, d, dtype=DT, generator=g).requires_grad_(True) for _ in range(3)]


def make_mask(kind, n, length):
    if kind == "none":
        return None
    if kind == "padded":  # one full, one short, one empty sequence
        return torch.arange(length)[None] < torch.tensor([length, max(length - 5, 1), 0])[:n, None]
    g = torch.Generator().manual_seed(3)
    m = torch.rand(n, length, generator=g) > 0.4
    m[0, 0] = False
    return m


def compare(q, k, v, mask, causal, window):
    fast = sliding_window_attention(q, k, v, mask, causal, window)
    ref = sliding_window_attention_ref(q, k, v, mask, causal, window)
    torch.testing.assert_close(fast, ref, rtol=1e-10, atol=1e-12)
    probe = torch.randn_like(ref)
    g_fast = torch.autograd.grad(fast, (q, k, v), probe)
    g_ref = torch.autograd.grad(ref, (q, k, v), probe)
    for a, b in zip(g_fast, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mask_kind", ["none", "padded", "scattered"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("length, window", [(12, 3), (11, 3), (13, 4), (10, 2), (5, 8), (7, 1)])
def test_matches_dense_reference(length, window, causal, mask_kind):
    q, k, v = qkv(length=length)
    compare(q, k, v, make_mask(mask_kind, 3, length), causal, window)


@pytest.mark.parametrize("causal", [False, True])
def test_chunks_of_windows_give_the_same_result(monkeypatch, causal):
    q, k, v = qkv(length=17)
    mask = make_mask("padded", 3, 17)
    whole = sliding_window_attention(q, k, v, mask, causal, 3)
    for groups in (1, 2, 4):
        monkeypatch.setattr(sw, "group_size", lambda item, g=groups: g)
        torch.testing.assert_close(sliding_window_attention(q, k, v, mask, causal, 3), whole, rtol=0, atol=1e-14)
        compare(q, k, v, mask, causal, 3)


def test_mask_is_one_window_back_and_forward():
    allowed = sliding_window_mask_ref(9, None, causal=False, window=3)[0, 0]
    # Position 4 (window 1) sees windows 0..2 = everything; position 0 (window 0) sees windows 0 and 1.
    assert allowed[4].all() and allowed[0, :6].all() and not allowed[0, 6:].any()
    assert not allowed[8, :3].any() and allowed[8, 3:].all()
    causal = sliding_window_mask_ref(9, None, causal=True, window=3)[0, 0]
    # Position 7 (window 2) sees window 1 and window 2 up to itself; position 3 (window 1) sees 0..3.
    assert causal[7].tolist() == [False] * 3 + [True] * 5 + [False]
    assert causal[3].tolist() == [True] * 4 + [False] * 5


def test_causal_outputs_do_not_depend_on_later_positions():
    q, k, v = qkv(n=1, length=12)
    out = sliding_window_attention(q, k, v, None, True, 4)
    out[0, :, 5].sum().backward()
    for t in (q, k, v):
        assert t.grad[:, :, 6:].abs().max() == 0
    assert k.grad[:, :, :4].abs().max() > 0  # window 0 is the previous window of position 5


def test_padding_is_never_attended_and_padded_outputs_are_zero():
    q, k, v = qkv(length=10)
    mask = make_mask("padded", 3, 10)
    out = sliding_window_attention(q, k, v, mask, False, 3)
    assert torch.equal(
        out[~mask[:, None, :, None].expand_as(out)], torch.zeros_like(out[~mask[:, None, :, None].expand_as(out)])
    )
    v2 = v.detach().clone()
    v2[~mask[:, None, :, None].expand_as(v2)] = 1e6
    torch.testing.assert_close(sliding_window_attention(q, k, v2, mask, False, 3), out)
    assert torch.isfinite(out).all()


def test_scores_grow_with_length_times_window(monkeypatch):
    """The score matrices SDPA receives hold L·3·window entries (bidirectional), not L²."""
    seen = []
    real_sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0):
        seen.append(q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2])
        return real_sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    sizes = []
    for length in (64, 128):
        seen.clear()
        q, k, v = (t.detach() for t in qkv(n=1, h=1, length=length))
        sliding_window_attention(q, k, v, None, False, 8)
        sizes.append(sum(seen))
    assert sizes == [64 * 24, 128 * 24]


def test_bad_inputs():
    q, k, v = qkv(length=6)
    with pytest.raises(ValueError, match="positive int window"):
        sliding_window_attention(q, k, v, None, False, 0)
    with pytest.raises(ValueError, match=r"key_mask must be a bool tensor of shape \(N, L\)"):
        sliding_window_attention(q, k, v, torch.ones(3, 5, dtype=torch.bool), False, 2)
    with pytest.raises(ValueError, match="one shape"):
        sliding_window_attention(q, k[:, :, :5], v, None, False, 2)
