"""Sliding-window (local) softmax attention, and its dense masked reference.

The sequence is cut into consecutive windows of ``window`` positions (the last one may be
shorter); position p lies in window ``p // window``. A query in window k attends to the keys of
windows k-1, k and k+1 (bidirectional), or, causally, to the keys of window k-1 and to the keys
of window k at or before it. So every query sees at least ``window`` keys back and, when
bidirectional, ``window`` forward: the "look one window back and one forward" local attention of
LRA's local Transformer as the SPT code runs it (``local_attention.LocalAttention`` with
``look_backward=1, look_forward=1``, not exact window sizes).

Shapes: q, k, v are (N, heads, L, head_dim); ``key_mask`` (N, L) bool is True at real positions.
Padded keys are never attended to and outputs at padded positions are zero; a query with no
admissible key outputs zero instead of NaN. Scores are scaled by ``1 / sqrt(head_dim)``.

Cost: each query scores at most 3 windows of keys (2 when causal), so time and memory are
O(L · window) rather than O(L²). Windows are processed in groups whose temporaries stay below
:data:`longrange.ops.chunking.TEMPORARY_BYTES`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from longrange.ops.chunking import group_size


def _check(q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, window: int) -> None:
    if q.dim() != 4 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(
            f"sliding-window attention expects q, k, v of one shape (N, heads, L, head_dim), got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise ValueError(f"sliding-window attention needs a positive int window, got {window!r}")
    if key_mask is not None and (key_mask.shape != (q.shape[0], q.shape[2]) or key_mask.dtype != torch.bool):
        raise ValueError(
            f"key_mask must be a bool tensor of shape (N, L) = {(q.shape[0], q.shape[2])}, got "
            f"{key_mask.dtype} {tuple(key_mask.shape)}"
        )


def sliding_window_mask_ref(length: int, key_mask: Tensor | None, causal: bool, window: int, device=None) -> Tensor:
    """Dense (N or 1, 1, L, L) bool matrix: may query i attend to key j. Reference only: O(L²)."""
    pos = torch.arange(length, device=device)
    qw, kw = (pos // window)[:, None], (pos // window)[None, :]
    if causal:
        allowed = (pos[:, None] >= pos[None, :]) & (qw - kw <= 1)
    else:
        allowed = (qw - kw).abs() <= 1
    allowed = allowed[None, None]
    if key_mask is None:
        return allowed
    return allowed & key_mask[:, None, None, :] & key_mask[:, None, :, None]


def sliding_window_attention_ref(
    q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, causal: bool, window: int
) -> Tensor:
    """Full softmax attention restricted to :func:`sliding_window_mask_ref`, written out; empty rows give 0."""
    _check(q, k, v, key_mask, window)
    allowed = sliding_window_mask_ref(q.shape[2], key_mask, causal, window, q.device)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    allowed = allowed.expand_as(scores)
    has_key = allowed.any(-1, keepdim=True)
    probs = torch.softmax(scores.masked_fill(~(allowed | ~has_key), float("-inf")), dim=-1)
    return (probs * has_key) @ v


def sliding_window_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_mask: Tensor | None,
    causal: bool,
    window: int,
    dropout_p: float = 0.0,
) -> Tensor:
    """Sliding-window attention of q over (k, v) (see the module docstring); (N, heads, L, head_dim) out.

    The length is padded to whole windows; each group of windows gathers the keys of its
    neighbour windows (3·window keys per query window, 2·window when causal) and attends
    through ``scaled_dot_product_attention`` with the window's mask.
    """
    _check(q, k, v, key_mask, window)
    n, h, length, d = q.shape
    n_win = -(-length // window)
    pad = n_win * window - length
    real = key_mask if key_mask is not None else torch.ones(n, length, dtype=torch.bool, device=q.device)
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        real = F.pad(real, (0, pad), value=False)
    # One empty window before the first and after the last: window j's neighbours are j, j+1, j+2 here.
    kp = F.pad(k.reshape(n, h, n_win, window, d), (0, 0, 0, 0, 1, 1))
    vp = F.pad(v.reshape(n, h, n_win, window, d), (0, 0, 0, 0, 1, 1))
    rp = F.pad(real.reshape(n, n_win, window), (0, 0, 1, 1), value=False)
    qw = q.reshape(n, h, n_win, window, d)
    span = 2 if causal else 3
    # Key j of the [previous, own(, next)] windows lies at offset j - window from the query window's
    # start; causally it is admissible when that offset is at most the query's own offset i.
    i = torch.arange(window, device=q.device)
    j = torch.arange(span * window, device=q.device)
    positional = (j[None, :] - window <= i[:, None]) if causal else None

    item = q.element_size() * n * h * (span * window * window + 2 * span * window * d + 2 * window * d)
    step = n_win if q.device.type == "meta" else group_size(item)  # meta allocates nothing: one piece
    outputs = []
    for a in range(0, n_win, step):
        b = min(a + step, n_win)
        c = b - a
        keys = torch.cat([kp[:, :, a + s : b + s] for s in range(span)], dim=-2)  # (n, h, c, span·w, d)
        values = torch.cat([vp[:, :, a + s : b + s] for s in range(span)], dim=-2)
        key_real = torch.cat([rp[:, a + s : b + s] for s in range(span)], dim=-1)  # (n, c, span·w)
        allowed = key_real[:, :, None, :]  # (n, c, 1, span·w)
        if positional is not None:
            allowed = allowed & positional
        allowed = allowed.expand(n, c, window, span * window)
        has_key = allowed.any(-1, keepdim=True)  # (n, c, w, 1)
        # Fold (n, c) into the batch so SDPA sees 4-D tensors; the mask broadcasts over heads.
        fold = lambda t: t.transpose(1, 2).reshape(n * c, h, t.shape[-2], d)  # noqa: E731
        out = F.scaled_dot_product_attention(
            fold(qw[:, :, a:b]),
            fold(keys),
            fold(values),
            attn_mask=(allowed | ~has_key).reshape(n * c, 1, window, span * window),
            dropout_p=dropout_p,
        )
        keep = has_key & rp[:, a + 1 : b + 1, :, None]  # real query with a key
        out = out.reshape(n, c, h, window, d) * keep[:, :, None].to(out.dtype)
        outputs.append(out)
    out = torch.cat(outputs, dim=1) if len(outputs) > 1 else outputs[0]  # (n, n_win, h, w, d)
    return out.transpose(1, 2).reshape(n, h, n_win * window, d)[:, :, :length]
