"""The attention kernels (full and blocked, padding-aware) against the dense written-out reference."""

from __future__ import annotations

import pytest
import torch

from longrange.ops.attention import admissible_ref, attention_ref, blocked_attention, masked_attention

DT = torch.float64


def make_mask(kind: str, batch: int, length: int) -> torch.Tensor | None:
    if kind == "none":
        return None
    if kind == "padded":  # left-aligned, one sequence unpadded, one fully padded
        lengths = torch.tensor([length, 3, 1, 0])[:batch]
        return torch.arange(length)[None, :] < lengths[:, None]
    if kind == "scattered":  # not left-aligned: holes anywhere, including at position 0
        g = torch.Generator().manual_seed(7)
        m = torch.rand(batch, length, generator=g) > 0.4
        m[0, 0] = False
        m[1] = False
        return m
    raise AssertionError(kind)


@pytest.mark.parametrize("block_size", [None, 1, 4, 5, 16])  # 16 > length: one short block
@pytest.mark.parametrize("mask_kind", ["none", "padded", "scattered"])
@pytest.mark.parametrize("causal", [True, False])
def test_fast_functions_match_reference(causal, mask_kind, block_size):
    torch.manual_seed(6)
    q, k, v = (torch.randn(4, 3, 10, 4, dtype=DT, requires_grad=True) for _ in range(3))
    key_mask = make_mask(mask_kind, 4, 10)
    if block_size is None:
        out = masked_attention(q, k, v, key_mask, causal)
    else:
        out = blocked_attention(q, k, v, key_mask, causal, block_size)
    ref = attention_ref(q, k, v, admissible_ref(10, key_mask, causal, block_size))
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    probe = torch.randn_like(out)
    g = torch.autograd.grad((out * probe).sum(), (q, k, v))
    g_ref = torch.autograd.grad((ref * probe).sum(), (q, k, v))
    for a, b in zip(g, g_ref):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
