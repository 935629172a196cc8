"""Long convolutions, causal or two-sided: by FFT, or by one matrix product for short sequences,
with a direct-convolution reference.

Convention, for an input ``u`` of shape (batch, h, l):

* causal kernel ``k`` of shape (h, lk)::

      y[b, h, t] = sum_{0 <= t - s < lk} k[h, t - s] * u[b, h, s]

* two-sided kernel ``(k_fwd, k_bwd)`` (a tuple, or a tensor of shape (2, h, lk))::

      y[b, h, t] = sum_{s <= t} k_fwd[h, t - s] * u[b, h, s]
                 + sum_{s > t}  k_bwd[h, s - t - 1] * u[b, h, s]

  i.e. ``k_bwd[j]`` weighs the input ``j + 1`` steps in the future: the backward kernel is
  strictly anti-causal and never touches the current position, which the forward kernel already
  covers. This is the S4 repository's bidirectional convention (backward kernel flipped and placed
  at the end of a zero-padded two-sided kernel) and equals running a causal SSM on the reversed
  sequence, shifted by one step.

* optional skip ``D`` of shape (h,): ``y += D[h] * u``, computed as part of the kernel (its tap at
  lag 0, :func:`with_skip`) by ``"fft"`` and ``"direct"``, and as written by ``"ref"``.

Kernel taps beyond the input length cannot reach any output and are dropped; a kernel shorter
than the input is zero-padded. Both FFTs are zero-padded to at least ``l + lk`` points so the
circular convolution of the FFT never wraps around.

The backward pass is written out (:class:`_FFTConv`) with real FFTs only: on the length-``n``
circle, with ``U``, ``K`` and ``G`` the real FFTs of the zero-padded input, kernel and output
gradient, the input's gradient is the first ``l`` points of ``irfft(G conj(K))`` (a correlation
with the kernel) and the kernel's the first ``lk`` of ``irfft(sum_b G conj(U))`` (summed over the
batch before the inverse FFT). PyTorch's own backward of ``rfft`` runs a full complex FFT of the
padded length, about five times the cost of the forward transform on a CPU.

**Implementations** (``impl``, the convention of :mod:`longrange.ops.dispatch`; op ``"fft_conv"``):

* ``"fft"``: the FFTs above, O(l log l) per channel;
* ``"direct"``: each channel's (l, l) Toeplitz matrix T (:func:`conv_matrix`) times the input, as
  one batched matrix product (:class:`_DirectConv`); its backward is two more products,
  ``grad_u = Tᵀ g`` and ``G = g uᵀ`` summed over the batch, whose diagonal sums are the kernel's
  gradient. O(l²) per channel, but a few large products instead of FFTs, complex products and
  copies: on a CPU, forward and backward, 1.2-1.4x faster at 16 and 24 positions, about as fast
  at 32 and slower from 48 on (docs/small-models.md, "Fourth round");
* ``"ref"``: :func:`fft_conv_ref`, the explicit matrix by autograd; never picked by ``"auto"``.

``"auto"`` runs ``"direct"`` on CPU tensors of at most :data:`DIRECT_MAX_LENGTH` positions and
``"fft"`` otherwise (on accelerators the crossover is not measured, so the FFT stays).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext

import torch
from torch import Tensor

from longrange.ops.chunking import TEMPORARY_BYTES, balanced_group_size, group_size
from longrange.ops.dispatch import Dispatcher, Impl
from longrange.ops.layout import transposed

#: On a CPU, the most bytes of spectra (one per input row) the FFT convolution transforms in one
#: group of channels: channels are convolved in even groups within it, whose padded inputs, spectra
#: and products stay closer to the caches. Forward and backward, channels last, against one group:
#: 1.12x at (batch 64, 64 channels, length 256), 1.10x at (64, 128, 256), 1.13x at (32, 128, 512),
#: 1.43x at (8, 256, 1024), the same within the noise where the spectra are smaller (8 MB groups
#: about as fast, 16 MB less so; docs/small-models.md, "Fifteenth round").
FFT_GROUP_BYTES = 4 * 2**20

#: The longest input ``"auto"`` convolves by :class:`_DirectConv` on a CPU (measured: faster than the
#: FFT up to 24 positions; at 32 the op is about as fast and MAD's memorization steps (H3, Hyena)
#: were 3-8% slower; docs/small-models.md, "Fourth round").
DIRECT_MAX_LENGTH = 24


def _auto(d: Dispatcher, device: torch.device, deterministic: bool, length: int | None = None, **context) -> str:
    """``"direct"`` on CPU tensors of at most :data:`DIRECT_MAX_LENGTH` positions, else ``"fft"``."""
    short = length is not None and length <= DIRECT_MAX_LENGTH
    return "direct" if device.type == "cpu" and short else "fft"


def _describe_auto(device: torch.device) -> str:
    if device.type == "cpu":
        return f"direct up to {DIRECT_MAX_LENGTH} positions, else fft"
    return "fft"


#: The implementations (see the module docstring); every backward is deterministic.
DISPATCHER = Dispatcher(
    "fft_conv",
    [
        Impl("fft", note="real FFTs, O(l log l)"),
        Impl("direct", note="one batched product with the Toeplitz matrix, O(l^2)"),
        Impl("ref", auto=False, note="the explicit matrix by autograd"),
    ],
    auto=_auto,
    describe_auto=_describe_auto,
)
IMPLS = DISPATCHER.IMPLS
set_default_impl = DISPATCHER.set_default_impl
default_impl = DISPATCHER.default_impl
available_impls = DISPATCHER.available_impls

KernelArg = Tensor | Sequence[Tensor]


def fast_fft_size(n: int) -> int:
    """Smallest integer >= ``n`` whose only prime factors are 2, 3 and 5 (fast FFT lengths)."""
    if n < 1:
        raise ValueError(f"FFT size must be positive, got {n}")
    m = n
    while True:
        r = m
        for p in (2, 3, 5):
            while r % p == 0:
                r //= p
        if r == 1:
            return m
        m += 1


def _split_kernel(u: Tensor, k: KernelArg) -> tuple[Tensor, Tensor | None]:
    """Validate shapes; return (k_fwd, k_bwd or None), each (h, lk)."""
    if u.dim() != 3:
        raise ValueError(f"fft_conv expects input u of shape (batch, h, l), got {tuple(u.shape)}")
    if u.is_complex():
        raise ValueError("fft_conv expects a real input u")
    h = u.shape[1]
    if isinstance(k, (tuple, list)):
        if len(k) != 2:
            raise ValueError(f"a two-sided kernel is a pair (k_fwd, k_bwd), got {len(k)} tensors")
        k_fwd, k_bwd = k
        if k_fwd.shape != k_bwd.shape:
            raise ValueError(f"two-sided kernel halves differ in shape: {tuple(k_fwd.shape)} vs {tuple(k_bwd.shape)}")
    elif isinstance(k, Tensor) and k.dim() == 3:
        if k.shape[0] != 2:
            raise ValueError(f"a stacked two-sided kernel has shape (2, h, lk), got {tuple(k.shape)}")
        k_fwd, k_bwd = k[0], k[1]
    elif isinstance(k, Tensor) and k.dim() == 2:
        k_fwd, k_bwd = k, None
    else:
        shape = tuple(k.shape) if isinstance(k, Tensor) else type(k).__name__
        raise ValueError(f"kernel must have shape (h, lk), (2, h, lk) or be a pair of (h, lk); got {shape}")
    if k_fwd.dim() != 2 or k_fwd.shape[0] != h:
        raise ValueError(f"kernel of shape {tuple(k_fwd.shape)} does not match input with h={h} channels")
    if k_fwd.shape[1] < 1:
        raise ValueError("kernel length must be at least 1")
    if k_fwd.is_complex() or (k_bwd is not None and k_bwd.is_complex()):
        raise ValueError("fft_conv expects a real kernel")
    return k_fwd, k_bwd


def _check_skip(u: Tensor, D: Tensor | None) -> None:
    if D is not None and D.shape != (u.shape[1],):
        raise ValueError(f"skip D must have shape ({u.shape[1]},), got {tuple(D.shape)}")


def _padded(x: Tensor, n: int, channels_last: bool) -> Tensor:
    """``x`` (batch, h, l), or (batch, l, h) when ``channels_last``, as a new (batch, h, n) tensor
    with zeros after its l positions: the FFT's input in one pass, which also lays a channels-last
    ``x`` out channel-first (``rfft(x, n=n)`` would fill all n positions with zeros, then copy)."""
    xs = x.transpose(1, 2) if channels_last else x
    b, h, l = xs.shape
    out = xs.new_empty(b, h, n)
    out[..., l:].zero_()
    out[..., :l].copy_(xs)
    return out


def _channels(x: Tensor, c: int, g: int, channels_last: bool) -> Tensor:
    """Channels ``c`` to ``c + g`` of ``x`` (a view)."""
    return x[..., c : c + g] if channels_last else x[:, c : c + g]


def _spectral(
    x: Tensor, f: Tensor, n: int, l: int, channels_last: bool, group: int, conj: bool, keep: list | None = None
) -> Tensor:
    """The first ``l`` points of ``irfft(rfft(x) f)`` (``conj``: times conj(f)) for x (batch, h, l),
    or (batch, l, h) ``channels_last``, and the spectra f (h, n // 2 + 1), in groups of ``group``
    channels, each written into the result laid out as ``x``; ``keep`` collects each group's rfft(x)."""
    h = x.shape[2] if channels_last else x.shape[1]
    if group >= h:  # one group: the inverse's first l points are the result (channels first: a view)
        x_f = torch.fft.rfft(_padded(x, n, channels_last))
        if keep is not None:
            keep.append(x_f)
        y = torch.fft.irfft(x_f * (f.conj() if conj else f), n=n)[..., :l]
        return y.transpose(1, 2).contiguous() if channels_last else y
    out = x.new_empty(x.shape)
    for c in range(0, h, group):
        x_f = torch.fft.rfft(_padded(_channels(x, c, group, channels_last), n, channels_last))
        if keep is not None:
            keep.append(x_f)
        f_c = f[c : c + group]
        y = torch.fft.irfft(x_f * (f_c.conj() if conj else f_c), n=n)[..., :l]
        _channels(out, c, group, channels_last).copy_(y.transpose(1, 2) if channels_last else y)
    return out


class _FFTConv(torch.autograd.Function):
    """``irfft(rfft(u, n) rfft(k, n), n)[..., :l]`` for u (batch, h, l) and k (h, lk), lk <= n,
    with the backward of the module docstring, in groups of ``group`` channels (all at once when
    None), each written into the result. ``channels_last``: u (batch, l, h) and the result laid out
    so, forward and backward (contiguous), the transposes folded into the FFTs' padding."""

    @staticmethod
    def forward(ctx, u: Tensor, k: Tensor, n: int, channels_last: bool = False, group: int | None = None) -> Tensor:
        l = u.shape[1] if channels_last else u.shape[-1]
        h = k.shape[0]
        group = h if group is None else group
        k_f = torch.fft.rfft(k, n=n)
        spectra: list[Tensor] = []
        y = _spectral(u, k_f, n, l, channels_last, group, conj=False, keep=spectra)
        ctx.save_for_backward(k_f, *spectra)
        ctx.n, ctx.l, ctx.lk, ctx.channels_last, ctx.group = n, l, k.shape[-1], channels_last, group
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None, None, None]:
        k_f, *spectra = ctx.saved_tensors
        n, cl, group = ctx.n, ctx.channels_last, ctx.group
        grad_u = grad_k = None
        if ctx.needs_input_grad[0]:
            grads: list[Tensor] = []
            grad_u = _spectral(grad, k_f, n, ctx.l, cl, group, conj=True, keep=grads)
        else:
            grads = [
                torch.fft.rfft(_padded(_channels(grad, c, group, cl), n, cl)) for c in range(0, k_f.shape[0], group)
            ]
        if ctx.needs_input_grad[1]:
            # sum_b G conj(U) = conj(sum_b conj(G) U): G is this backward's own, conjugated in place
            # (half a pass over it), where a product with the conjugate view of the saved U would
            # first copy all of it; the conjugate is then taken of the (h, n // 2 + 1) sum alone.
            sums = []
            for g_f, u_f in zip(grads, spectra):
                g_f.imag.neg_()
                sums.append((g_f * u_f).sum(0).conj())
            grad_k = torch.fft.irfft(sums[0] if len(sums) == 1 else torch.cat(sums), n=n)[..., : ctx.lk]
        return grad_u, grad_k, None, None, None


def _diagonal_sums(M: Tensor, count: int) -> Tensor:
    """``out[..., m] = sum_t M[..., t, t - m]`` for m < ``count`` (the sums along the diagonals at or
    below the main one) of M (h, l, l): rows of zeros appended below, a stride of l + 1 walks each
    diagonal, and steps past its end land in the zeros."""
    h, l, _ = M.shape
    padded = torch.cat([M, M.new_zeros(h, l, l)], dim=1)
    return padded.as_strided((h, count, l), (2 * l * l, l, l + 1)).sum(-1)


class _DirectConv(torch.autograd.Function):
    """``y[b, h] = T[h] u[b, h]`` for u (batch, h, l) and the (h, l, l) matrices of
    :func:`conv_matrix` (kernels of at most l taps), with its backward written out: ``Tᵀ g`` for u,
    and for the kernels the diagonal sums of ``sum_b g[b] u[b]ᵀ`` (at or below the main diagonal
    for ``k_fwd``, strictly above it for ``k_bwd``)."""

    @staticmethod
    def forward(ctx, u: Tensor, k_fwd: Tensor, k_bwd: Tensor | None) -> Tensor:
        T = conv_matrix(k_fwd, k_bwd, u.shape[-1])
        # Channels first, (h, b, l), in one copy: a batched product over a strided batch dimension
        # (a view of another layout, as Hyena's gated branches are) falls back to a loop of products.
        u = u.transpose(0, 1).contiguous()
        ctx.save_for_backward(u, T)
        ctx.lk, ctx.two_sided = k_fwd.shape[-1], k_bwd is not None
        # (h, b, l) @ (h, l, l) -> (h, b, l): y[h, b, t] = sum_s u[h, b, s] T[h, t, s]
        return torch.matmul(u, T.transpose(1, 2)).transpose(0, 1)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        with _no_autocast(grad.device):  # a backward called under autocast too
            return _DirectConv._backward(ctx, grad)

    @staticmethod
    def _backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        u, T = ctx.saved_tensors  # u: (h, b, l)
        g = grad.transpose(0, 1).to(u.dtype).contiguous()  # (h, b, l)
        needs = ctx.needs_input_grad
        grad_u = torch.matmul(g, T).transpose(0, 1) if needs[0] else None
        grad_fwd = grad_bwd = None
        if needs[1] or (ctx.two_sided and needs[2]):
            M = torch.matmul(g.transpose(1, 2), u)  # (h, l, l): M[t, s] = sum_b g[b, t] u[b, s]
            grad_fwd = _diagonal_sums(M, ctx.lk) if needs[1] else None
            if ctx.two_sided and needs[2]:  # k_bwd[j] weighs lag t - s = -(j + 1)
                grad_bwd = _diagonal_sums(M.transpose(1, 2), min(ctx.lk + 1, M.shape[-1]))[..., 1:]
                if grad_bwd.shape[-1] < ctx.lk:  # taps beyond l - 1 steps reach no output
                    grad_bwd = torch.cat([grad_bwd, grad_bwd.new_zeros(*grad_bwd.shape[:-1], 1)], -1)
        return grad_u, grad_fwd, grad_bwd


def _fft_conv_core(u: Tensor, k: Tensor, n: int, channels_last: bool = False, group: int | None = None) -> Tensor:
    """The linear convolution of u (batch, h, l) with k (h, lk), lk <= n, on the length-``n`` circle
    (``channels_last``: u and the result (batch, l, h)), ``group`` channels at a time (None: all)."""
    return _FFTConv.apply(u, k, n, channels_last, group)


def fft_conv(
    u: Tensor,
    k: KernelArg,
    D: Tensor | None = None,
    *,
    chunk_bytes: int = TEMPORARY_BYTES,
    impl: str | None = None,
    channels_last: bool = False,
) -> Tensor:
    """Convolve ``u`` (batch, h, l) with a causal or two-sided kernel; see the module doc.

    Returns (batch, h, l) in the dtype of ``u``; the convolution runs in the wider of the operands'
    dtypes and float32. ``impl``: ``"fft"``, ``"direct"``, ``"ref"`` or ``"auto"`` (None: the
    process-wide default, :func:`set_default_impl`; see the module docstring). Channels are
    convolved in groups whose spectra (``"fft"``) or matrices (``"direct"``) stay under
    ``chunk_bytes`` (see :mod:`longrange.ops.chunking`).

    ``channels_last``: ``u`` is (batch, l, h), as the layers around a convolution lay out their
    activations, and so is the result, contiguous, and the input's gradient. By FFT the transposes
    are part of the FFTs' zero-padding copies, so the layout costs no pass of its own; the other
    implementations transpose around the convolution (:func:`~longrange.ops.layout.transposed`).
    """
    if channels_last and u.dim() != 3:
        raise ValueError(f"fft_conv expects input u of shape (batch, l, h) (channels_last), got {tuple(u.shape)}")
    first = u.transpose(1, 2) if channels_last else u  # (batch, h, l), for the checks
    k_fwd, k_bwd = _split_kernel(first, k)
    _check_skip(first, D)
    impl = DISPATCHER.resolve(impl, u.device, length=first.shape[-1])
    if channels_last and impl != "fft":  # the others work channels first
        return transposed(fft_conv(transposed(u), k, D, chunk_bytes=chunk_bytes, impl=impl))
    DISPATCHER.note(impl)
    # In at least float32 (half-precision FFTs are unsupported on CPU and lose accuracy on long
    # kernels), in float64 if either operand is float64; the result has u's dtype.
    work = torch.promote_types(torch.promote_types(u.dtype, k_fwd.dtype), torch.float32)
    # In ``work`` whatever autocast says: under bf16 autocast the products of ``direct`` and ``ref``
    # would run in bf16 (and ``direct``'s backward meet a bf16 gradient).
    with _no_autocast(u.device):
        return _convolve(u, k_fwd, k_bwd, D, work, impl, chunk_bytes, channels_last).to(u.dtype)


def _no_autocast(device: torch.device) -> AbstractContextManager:
    """Autocast off on ``device``; nothing where the device type has no autocast (``meta``)."""
    return torch.autocast(device.type, enabled=False) if device.type in ("cpu", "cuda") else nullcontext()


def _convolve(
    u: Tensor,
    k_fwd: Tensor,
    k_bwd: Tensor | None,
    D: Tensor | None,
    work: torch.dtype,
    impl: str,
    chunk_bytes: int,
    channels_last: bool = False,
) -> Tensor:
    """:func:`fft_conv`'s convolution by ``impl`` in the dtype ``work`` (the result in ``work``);
    ``channels_last`` (``"fft"`` only): ``u`` and the result (batch, l, h)."""
    h_dim = 2 if channels_last else 1
    l = u.shape[1] if channels_last else u.shape[-1]
    u_w = u.to(work)
    if impl == "ref":
        kernel = k_fwd.to(work) if k_bwd is None else (k_fwd.to(work), k_bwd.to(work))
        return fft_conv_ref(u_w, kernel, None if D is None else D.to(work))
    lk = min(k_fwd.shape[-1], l)  # longer kernels: taps >= l never reach an output
    k_fwd = k_fwd[..., :lk]
    k_bwd = None if k_bwd is None else k_bwd[..., :lk]
    if D is not None:  # the skip is the kernel's tap at lag 0: no product and sum beside the convolution
        k_fwd = with_skip(k_fwd.to(work), D.to(work))
    item = torch.empty((), dtype=work).element_size()
    if impl == "direct":
        # its matrix, its input and output, and in the backward the (l, l) product with its padded copy
        per_channel = (4 * l * l + 2 * u.shape[0] * l) * item

        def convolve(c: int, g: int) -> Tensor:
            back = None if k_bwd is None else k_bwd[c : c + g].to(work)
            return _DirectConv.apply(u_w[:, c : c + g], k_fwd[c : c + g].to(work), back)

    else:
        n = fast_fft_size(l + lk)
        if k_bwd is None:
            k_full = k_fwd
        else:
            # Two-sided kernel on the length-n circle: lags 0..lk-1 at the front, lags -1..-lk (the
            # flipped backward kernel) at the back; n >= l + lk keeps the two regions apart for all
            # lags |t - s| < l that occur.
            zeros = k_fwd.new_zeros(k_fwd.shape[0], n - 2 * lk)
            k_full = torch.cat([k_fwd, zeros, k_bwd.flip(-1)], dim=-1)
        per_channel = u.shape[0] * (n // 2 + 1) * 2 * item
        h = u.shape[h_dim]
        if u.device.type == "meta":
            group = h
        elif u.device.type == "cpu":
            group = balanced_group_size(h, per_channel, min(chunk_bytes, FFT_GROUP_BYTES))
        else:
            group = group_size(per_channel, chunk_bytes)
        # the groups inside one autograd node: each writes its part of the result and of the gradient
        return _fft_conv_core(u_w, k_full.to(work), n, channels_last, group)

    group = u.shape[1] if u.device.type == "meta" else group_size(per_channel, chunk_bytes)
    parts = [convolve(c, group) for c in range(0, u.shape[1], group)]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def with_skip(k: Tensor, D: Tensor) -> Tensor:
    """The causal kernel ``k`` (h, lk) with the skip ``D`` (h,) added to its tap at lag 0: convolving
    with it gives ``conv(u, k) + D u``, and the kernel's gradient at lag 0 is D's. Folded in, the
    skip costs no pass over the (batch, h, l) tensors, forward or backward, where ``y + D u`` took
    four (and ran several times slower where ``u`` is a transposed view, as the layers pass it)."""
    return torch.cat([k[..., :1] + D.unsqueeze(-1), k[..., 1:]], dim=-1)


def conv_matrix(k_fwd: Tensor, k_bwd: Tensor | None, l: int) -> Tensor:
    """The (h, l, l) matrix T with y[t] = sum_s T[t, s] u[s] for the module's convention."""
    h, lk = k_fwd.shape
    t = torch.arange(l, device=k_fwd.device)
    lag = t.unsqueeze(1) - t.unsqueeze(0)  # lag[t, s] = t - s
    pad = torch.zeros(h, max(l - lk, 0) + 1, dtype=k_fwd.dtype, device=k_fwd.device)
    fwd = torch.cat([k_fwd, pad], dim=-1)  # index l' >= lk reads a zero
    zero = torch.zeros((), dtype=k_fwd.dtype, device=k_fwd.device)
    T = torch.where(lag >= 0, fwd[:, lag.clamp(0, fwd.shape[-1] - 1)], zero)
    if k_bwd is not None:
        bwd = torch.cat([k_bwd, pad], dim=-1)
        idx = (-lag - 1).clamp(0, bwd.shape[-1] - 1)
        T = T + torch.where(lag < 0, bwd[:, idx], zero)
    return T


def fft_conv_ref(u: Tensor, k: KernelArg, D: Tensor | None = None) -> Tensor:
    """Reference for :func:`fft_conv` by direct summation with an explicit Toeplitz matrix."""
    k_fwd, k_bwd = _split_kernel(u, k)
    _check_skip(u, D)
    T = conv_matrix(k_fwd.to(u.dtype), None if k_bwd is None else k_bwd.to(u.dtype), u.shape[-1])
    y = torch.einsum("hts,bhs->bht", T, u)
    if D is not None:
        y = y + D.to(u.dtype).unsqueeze(-1) * u
    return y
