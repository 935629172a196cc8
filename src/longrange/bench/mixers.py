"""The sequence-mixing layers measured against length, and the matrix-state ops against their loops
(``benchmarks/matrix_state.py``; each point in a fresh process by :func:`longrange.bench.measure.run_isolated`).

:func:`measure_layer`: the forward (without gradients) and the forward + backward of one mixing
layer at one length, seconds and peak memory. The layers are whole: the new mixers with their
projections, gates and norms; S6 inside its Mamba block; attention with its projections.

:func:`measure_op`: one matrix-state op's forward + backward at one length by one implementation
(``chunk``, ``naive``, or for SSD ``minimal``: the algorithm of the authors' ``ssd_minimal_discrete``,
the quadratic-in-chunks segment sums written out here, run on the same inputs).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from longrange.bench import measure

#: The layers, as built for the benchmark (width ``d``): name -> (primitive, options).
LAYERS: dict[str, tuple[str, dict[str, Any]]] = {
    "mamba2": ("mamba2", {"d_state": 128, "headdim": 64}),
    "mamba3": ("mamba3", {"d_state": 128, "headdim": 64}),
    "mamba3-mimo": ("mamba3", {"d_state": 128, "headdim": 64, "mimo_rank": 4}),
    "gla": ("gla", {"n_heads": 4}),
    "deltanet": ("deltanet", {"n_heads": 4}),
    "gated-deltanet": ("gated-deltanet", {"n_heads": 4}),
    "linear-attention": ("linear-attention", {"n_heads": 4, "feature_map": "taylor", "feature_dim": 16}),
    "mamba-s6": ("s6", {"d_state": 16}),
    "attention": ("attention", {"n_heads": 4}),
}
OPS = ("ssd", "gla", "delta_rule", "gated_delta_rule", "mamba3", "mamba3_mimo")
#: The rank of Mamba-3 MIMO here (the authors' default); its chunks are ``chunk_size // MIMO_RANK``
#: positions, ``chunk_size`` rank-positions, as they recommend.
MIMO_RANK = 4


def build_layer(name: str, d: int) -> torch.nn.Module:
    """The layer ``name`` of :data:`LAYERS` at width ``d``, causal."""
    primitive, options = LAYERS[name]
    if name == "mamba-s6":
        from longrange.models import ModelConfig
        from longrange.models.backbone import make_block

        return make_block(
            ModelConfig(block="mamba", primitive="s6", d_model=d, d_state=options["d_state"], norm="none")
        )
    from longrange.models.backbone import make_primitive

    options = dict(options)
    d_state = options.pop("d_state", None)
    return make_primitive(primitive, d, d_state=d_state, **options)


def measure_layer(
    name: str,
    length: int,
    batch: int = 8,
    d: int = 256,
    warmup: int = 1,
    batches: int = 3,
    threads: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Forward (no gradients) and forward + backward of the layer ``name`` on (batch, length, d)."""
    device = torch.device("cpu")
    with measure.torch_threads(threads):
        torch.manual_seed(seed)
        layer = build_layer(name, d)
        x = torch.randn(batch, length, d)

        def forward() -> None:
            with torch.no_grad():
                layer(x)

        def train() -> None:
            layer(x).square().mean().backward()
            layer.zero_grad(set_to_none=True)

        out: dict[str, Any] = {
            "layer": name,
            "length": length,
            "batch": batch,
            "d": d,
            "params": sum(p.numel() for p in layer.parameters()),
        }
        for what, fn in (("forward", forward), ("fwdbwd", train)):
            with measure.PeakMemory(device) as mem:
                times = measure.time_calls(fn, warmup=warmup, batches=batches, device=device)
            summary = measure.summarize_times(times)
            out[f"{what}_s"], out[f"{what}_min_s"], out[f"{what}_peak_mb"] = summary["mean"], min(times), mem.peak_mb
        return out


def op_inputs(op: str, batch: int, length: int, heads: int, dk: int, dv: int, seed: int = 0) -> dict[str, Tensor]:
    """Random inputs of ``op`` as its layers produce them (normalised keys, decays in (0, 1))."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    unit = lambda *s: torch.rand(*s, generator=g)  # noqa: E731
    b, l, h = batch, length, heads
    if op == "mamba3_mimo":
        r = MIMO_RANK
        return {
            "x": rand(b, l, r, h, dv),
            "dt": 0.001 + 0.1 * unit(b, l, h),
            "A": -1 - unit(b, l, h),
            "B": rand(b, l, r, 1, dk),
            "C": rand(b, l, r, 1, dk),
            "trap": rand(b, l, h),
            "angles": rand(b, l, h, dk // 4),
            "B_bias": torch.ones(h, r, dk),
            "C_bias": torch.ones(h, r, dk),
            "D": torch.ones(h),
        }
    if op in ("ssd", "mamba3"):
        inputs = {
            "x": rand(b, l, h, dv),
            "dt": 0.001 + 0.1 * unit(b, l, h),
            "A": -1 - 15 * unit(h),
            "B": rand(b, l, 1, dk),
            "C": rand(b, l, 1, dk),
            "D": torch.ones(h),
        }
        if op == "mamba3":
            inputs.update(
                A=-1 - unit(b, l, h),
                trap=rand(b, l, h),
                angles=rand(b, l, h, dk // 4),
                B_bias=torch.ones(h, dk),
                C_bias=torch.ones(h, dk),
            )
        return inputs
    inputs = {"q": rand(b, l, h, dk), "k": F.normalize(rand(b, l, h, dk), dim=-1), "v": rand(b, l, h, dv)}
    if op == "gla":
        inputs["g"] = F.logsigmoid(rand(b, l, h, dk)) / 16
    if op in ("delta_rule", "gated_delta_rule"):
        inputs["beta"] = unit(b, l, h)
    if op == "gated_delta_rule":
        inputs["g"] = -0.1 * unit(b, l, h)
    return inputs


def ssd_minimal(
    x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None = None, chunk_size: int = 64
) -> Tensor:
    """SSD by the algorithm of the authors' ``ssd_minimal_discrete`` (mamba-ssm
    ``modules/ssd_minimal.py``): within chunks the masked matrix of segment sums exp(segsum(A dt)),
    per chunk the states, between chunks the (chunks + 1)^2 matrix of segment sums of the chunks'
    total decays, then the outputs of the states. Written here from the published algorithm, as the
    baseline of the benchmark; the length must be a multiple of ``chunk_size``."""
    b, l, h, p = x.shape
    n, c = B.shape[-1], chunk_size
    nc = l // c
    xd = (x * dt.unsqueeze(-1)).reshape(b, nc, c, h, p)
    a = (A * dt).reshape(b, nc, c, h).permute(0, 3, 1, 2)  # (b, h, nc, c)
    Bh = B.expand(b, l, h, n).reshape(b, nc, c, h, n)
    Ch = C.expand(b, l, h, n).reshape(b, nc, c, h, n)
    a_cum = a.cumsum(-1)

    def segsum(t: Tensor) -> Tensor:  # exp-able log of products of decays
        T = t.shape[-1]
        t = t.unsqueeze(-1).expand(*t.shape, T)
        lower = torch.tril(torch.ones(T, T, dtype=torch.bool, device=t.device), -1)
        t = t.masked_fill(~lower, 0).cumsum(-2)
        return t.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool, device=t.device)), -torch.inf)

    L = torch.exp(segsum(a))  # (b, h, nc, c, c)
    y_diag = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", Ch, Bh, L, xd)
    decay_states = torch.exp(a_cum[..., -1:] - a_cum)
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", Bh, decay_states, xd)
    states = torch.cat([torch.zeros_like(states[:, :1]), states], dim=1)
    decay_chunk = torch.exp(segsum(F.pad(a_cum[..., -1], (1, 0))))  # (b, h, nc + 1, nc + 1)
    states = torch.einsum("bhzc,bchpn->bzhpn", decay_chunk, states)[:, :-1]
    y_off = torch.einsum("bclhn,bchpn,bhcl->bclhp", Ch, states, torch.exp(a_cum))
    y = (y_diag + y_off).reshape(b, l, h, p)
    return y if D is None else y + x * D[:, None]


def _op_call(op: str, impl: str, chunk_size: int | None) -> Any:
    from longrange.ops.matrix_state.families import family

    if op == "ssd" and impl == "minimal":
        return lambda **kw: ssd_minimal(**kw, chunk_size=chunk_size)
    if impl == "numba":  # the delta rules' kernels, at their own spans of checkpoints
        from longrange.ops.matrix_state import numba as ms_numba

        return getattr(ms_numba, f"{op}_numba")
    fn = getattr(family(op), f"{op}_{impl}")
    if impl != "chunk" or chunk_size is None:  # None: the op's own default
        return fn
    return lambda **kw: fn(**kw, chunk_size=chunk_size)


def measure_op(
    op: str,
    impl: str,
    length: int,
    batch: int = 8,
    heads: int = 4,
    dk: int = 64,
    dv: int = 64,
    chunk_size: int | None = 64,
    warmup: int = 1,
    batches: int = 3,
    threads: int | None = None,
) -> dict[str, Any]:
    """Forward + backward of ``op`` by ``impl`` (``chunk``, ``naive``, ``minimal`` for SSD, ``numba``
    for the delta rules); Mamba-3 MIMO's chunks are ``chunk_size // MIMO_RANK`` positions
    (``chunk_size`` rank-positions); ``chunk_size=None``: the op's default."""
    device = torch.device("cpu")
    if op == "mamba3_mimo" and chunk_size is not None:
        chunk_size = max(1, chunk_size // MIMO_RANK)
    with measure.torch_threads(threads):
        inputs = op_inputs(op, batch, length, heads, dk, dv)
        leaves = {k: v.requires_grad_() for k, v in inputs.items() if k not in ("D", "B_bias", "C_bias")}
        fn = _op_call(op, impl, chunk_size)

        def step() -> None:
            out = fn(**inputs)
            (out[0] if isinstance(out, tuple) else out).square().mean().backward()
            for t in leaves.values():
                t.grad = None

        with measure.PeakMemory(device) as mem:
            times = measure.time_calls(step, warmup=warmup, batches=batches, device=device)
        summary = measure.summarize_times(times)
        return {
            "op": op,
            "impl": impl,
            "length": length,
            "batch": batch,
            "heads": heads,
            "dk": dk,
            "dv": dv,
            "chunk_size": chunk_size,
            "fwdbwd_s": summary["mean"],
            "fwdbwd_min_s": min(times),
            "peak_mb": mem.peak_mb,
        }
