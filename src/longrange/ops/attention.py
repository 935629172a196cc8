"""Softmax self-attention kernels over (batch, heads, L, head_dim), padding-aware, full or blocked.

Shapes: q, k, v are (N, heads, L, head_dim); scores are scaled by ``1 / sqrt(head_dim)``.
``key_mask`` (N, L) bool marks real positions: a padded position neither attends nor is attended
to, and its output is zero. A query with no admissible key outputs zero instead of NaN.

- :func:`masked_attention`: full attention (causal or not) through PyTorch's
  ``scaled_dot_product_attention``, which picks a fused kernel where it can.
- :func:`blocked_attention`: attention within consecutive blocks of ``block_size`` positions
  (O(L·B) memory instead of O(L²)).
- :func:`attention_ref` with :func:`admissible_ref`: the dense, written-out reference both are
  tested against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from longrange.ops.dataless import holds_data


def admissible_ref(length: int, key_mask: Tensor | None, causal: bool, block_size: int | None, device=None) -> Tensor:
    """Dense (N or 1, 1, L, L) bool matrix: may query i attend to key j. Reference only: O(L²).

    ``key_mask`` (N, L) marks real positions; a padded position neither attends nor is attended to.
    """
    pos = torch.arange(length, device=device)
    allowed = torch.ones(length, length, dtype=torch.bool, device=device)
    if causal:
        allowed &= pos[:, None] >= pos[None, :]
    if block_size is not None:
        allowed &= (pos[:, None] // block_size) == (pos[None, :] // block_size)
    allowed = allowed[None, None]
    if key_mask is None:
        return allowed
    return allowed & key_mask[:, None, None, :] & key_mask[:, None, :, None]


def attention_ref(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor) -> Tensor:
    """softmax(q kᵀ / √d, restricted to ``allowed``) v, written out; rows with no admissible key give 0.

    The slow, obviously-correct reference for :func:`masked_attention` and :func:`blocked_attention`.
    q, k, v: (N, heads, L, head_dim); ``allowed`` broadcasts to (N, heads, L, L).
    """
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    allowed = allowed.expand_as(scores)
    has_key = allowed.any(-1, keepdim=True)
    # Empty rows are given every key (finite softmax, no NaN in the backward pass), then zeroed.
    probs = torch.softmax(scores.masked_fill(~(allowed | ~has_key), float("-inf")), dim=-1)
    return (probs * has_key) @ v


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
    """Softmax self-attention of q over (k, v), all (N, heads, L, head_dim), through SDPA.

    ``key_mask`` (N, L) bool marks real positions: padded keys are never attended to and the
    outputs at padded positions are zero. Rows with no admissible key return zero rather than NaN.
    """
    if key_mask is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal)
    if causal and not torch.compiler.is_compiling() and _is_left_aligned(key_mask):
        # With padding only at the end, the causal mask alone keeps every real query away from
        # padded keys, and no real query row is empty. Keeping ``is_causal`` lets SDPA use its
        # fused kernels; the padded rows (which did see padded keys) are zeroed afterwards.
        # Compiled, the general path below runs: testing the mask's values would split the graph.
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
        return out * key_mask[:, None, :, None].to(out.dtype)
    length = q.shape[-2]
    allowed = key_mask[:, None, None, :]  # (N, 1, 1, L)
    if causal:
        allowed = allowed & torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
    has_key = allowed.any(dim=-1, keepdim=True)
    # An empty row would give softmax over nothing (NaN): let it see every key, then zero it.
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed | ~has_key, dropout_p=dropout_p)
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
