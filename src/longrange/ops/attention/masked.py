"""Softmax self-attention over (batch, heads, L, head_dim), padding-aware, full or blocked.

Shapes: q, k, v are (N, heads, L, head_dim); scores are scaled by ``1 / sqrt(head_dim)``.
``key_mask`` (N, L) bool marks real positions: a padded position neither attends nor is attended
to, and its output is zero. A query with no admissible key outputs zero instead of NaN.

- :func:`masked_attention`: full attention (causal or not). Without a mask, or with causal
  attention and padding only at the end, it runs :func:`~longrange.ops.attention.dispatch.attention`
  (PyTorch's ``scaled_dot_product_attention`` or the numba kernels); with any other mask, PyTorch's
  attention with the mask.
- :func:`blocked_attention`: attention within consecutive blocks of ``block_size`` positions
  (O(L·B) memory instead of O(L²)).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from longrange.ops.attention.dispatch import DISPATCHER, attention
from longrange.ops.dataless import holds_data


def _is_left_aligned(mask: Tensor) -> bool:
    """True if every row of ``mask`` (batch, L) is real positions followed only by padding. A mask
    without data (dry runs, :mod:`longrange.ops.dataless`) counts as left-aligned, as every mask made
    from lengths (``padding_mask``) is."""
    if not holds_data(mask):
        return True
    return bool((mask[:, 1:] <= mask[:, :-1]).all()) if mask.shape[1] > 1 else True


def masked_attention(
    q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, causal: bool, dropout_p: float = 0.0
) -> Tensor:
    """Softmax self-attention of q over (k, v), all (N, heads, L, head_dim).

    ``key_mask`` (N, L) bool marks real positions: padded keys are never attended to and the
    outputs at padded positions are zero. Rows with no admissible key return zero rather than NaN.
    """
    if key_mask is None:
        return attention(q, k, v, causal, dropout_p)
    if causal and not torch.compiler.is_compiling() and _is_left_aligned(key_mask):
        # With padding only at the end, the causal mask alone keeps every real query away from
        # padded keys, and no real query row is empty. Attention without a mask runs (SDPA's fused
        # kernels, or the numba kernels); the padded rows (which did see padded keys) are zeroed
        # afterwards. Compiled, the general path below runs: testing the mask's values would split
        # the graph.
        out = attention(q, k, v, True, dropout_p)
        return out * key_mask[:, None, :, None].to(out.dtype)
    length = q.shape[-2]
    allowed = key_mask[:, None, None, :]  # (N, 1, 1, L)
    if causal:
        allowed = allowed & torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
    has_key = allowed.any(dim=-1, keepdim=True)
    # An empty row would give softmax over nothing (NaN): let it see every key, then zero it.
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed | ~has_key, dropout_p=dropout_p)
    DISPATCHER.note("sdpa")
    return out * (has_key & key_mask[:, None, :, None]).to(out.dtype)


def blocked_attention(
    q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, causal: bool, block_size: int, dropout_p: float = 0.0
) -> Tensor:
    """Attention within consecutive blocks of ``block_size`` positions; same shapes as :func:`masked_attention`.

    Full blocks are folded into the batch, (N·blocks, heads, B, head_dim); a shorter last block is
    attended separately so that no padding to a multiple of B is needed.
    """
    n, h, length, d = q.shape
    n_full = length // block_size
    full_len = n_full * block_size
    outputs = []
    if n_full:

        def fold(t: Tensor) -> Tensor:
            t = t[:, :, :full_len].reshape(n, h, n_full, block_size, d)
            return t.transpose(1, 2).reshape(n * n_full, h, block_size, d)

        fm = None if key_mask is None else key_mask[:, :full_len].reshape(n * n_full, block_size)
        out = masked_attention(fold(q), fold(k), fold(v), fm, causal, dropout_p)
        outputs.append(out.reshape(n, n_full, h, block_size, d).transpose(1, 2).reshape(n, h, full_len, d))
    if full_len < length:
        rm = None if key_mask is None else key_mask[:, full_len:]
        outputs.append(
            masked_attention(q[:, :, full_len:], k[:, :, full_len:], v[:, :, full_len:], rm, causal, dropout_p)
        )
    return torch.cat(outputs, dim=2) if len(outputs) > 1 else outputs[0]
