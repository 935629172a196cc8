"""The primitive layers' cases for ``longrange check`` (:mod:`longrange.check`): each layer's
recurrent (step) mode against its parallel forward, causal and, for bidirectional layers, their two
directions stepped against the bidirectional forward.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import Tensor

from longrange.layers.attention import Attention
from longrange.layers.base_conv import BaseConv
from longrange.layers.deltanet import DeltaNet, GatedDeltaNet
from longrange.layers.dlr import DLR
from longrange.layers.gla import GLA
from longrange.layers.h3 import H3
from longrange.layers.hyena import Hyena
from longrange.layers.linear_attention import LinearAttention
from longrange.layers.lru import LRU
from longrange.layers.mamba2 import Mamba2
from longrange.layers.mamba3 import Mamba3
from longrange.layers.rwkv import RWKV
from longrange.layers.s4 import S4
from longrange.layers.s4d import S4D
from longrange.layers.s6 import S6
from longrange.ops import scan
from longrange.ops.checking import TOLERANCE, Case, compare, random_inputs


def _conv_ssm_directions(bi: torch.nn.Module, make: Callable[[bool], torch.nn.Module], c_name: str):
    """The two causal directions of a bidirectional convolutional SSM (S4, S4D, DLR): the same
    parameters with the forward or the backward output vector (``c_name``), and no skip term
    backward. The backward direction, run on the reversed sequence and seen one step later, is the
    layer's backward part."""
    state = bi.state_dict()
    shared = {k: v for k, v in state.items() if k != c_name}
    fwd, bwd = make(False), make(False)
    fwd.load_state_dict({**shared, c_name: state[c_name][:1]})
    bwd.load_state_dict(
        {**shared, c_name: state[c_name][1:], **({"D": torch.zeros_like(state["D"])} if "D" in state else {})}
    )
    return fwd, bwd, True


def _flip_sum_directions(bi: torch.nn.Module):
    """The two causal layers of a flip-and-sum bidirectional layer (S6), not shifted."""
    return bi.directions.fwd, bi.directions.bwd, False


def _placed(layer: torch.nn.Module, index: int) -> torch.nn.Module:
    layer.place_in_stack(index, index + 1)
    return layer


def _s4(bidirectional: bool) -> torch.nn.Module:
    return S4(3, d_state=6, rank=2, tie_pq=False, l_max=8, dt_min=0.01, dt_max=0.5, bidirectional=bidirectional)


def _s4d(bidirectional: bool) -> torch.nn.Module:
    return S4D(3, d_state=6, bidirectional=bidirectional)


def _dlr(bidirectional: bool) -> torch.nn.Module:
    return DLR(3, d_state=6, bidirectional=bidirectional)


#: The primitives checked: (name, build(bidirectional), split(bidirectional layer) -> (forward
#: layer, backward layer, whether the backward part is shifted by one step), or None where a
#: bidirectional layer has no directions to step).
PRIMITIVES: list[tuple[str, Callable[[bool], torch.nn.Module], Callable | None]] = [
    ("S4", _s4, lambda bi: _conv_ssm_directions(bi, _s4, "C_tilde")),
    ("S4D", _s4d, lambda bi: _conv_ssm_directions(bi, _s4d, "C")),
    ("DLR", _dlr, lambda bi: _conv_ssm_directions(bi, _dlr, "C")),
    ("S6", lambda bi: S6(4, d_state=3, bidirectional=bi), _flip_sum_directions),
    # The LRU in chunks of 4; bidirectional: its shared-λ directions (the backward one reads t itself).
    (
        "LRU",
        lambda bi: LRU(6, d_state=4, r_min=0.5, r_max=0.95, chunk_size=4, bidirectional=bi),
        lambda bi: (*bi.causal_directions(), False),
    ),
    # The matrix-state layers in chunks of 4 (the 11 steps cross chunks), short convolutions on.
    ("Mamba-2", lambda bi: Mamba2(8, d_state=4, headdim=4, chunk_size=4, bidirectional=bi), _flip_sum_directions),
    ("Mamba-3", lambda bi: Mamba3(8, d_state=4, headdim=4, chunk_size=4, bidirectional=bi), _flip_sum_directions),
    (
        "Mamba-3 MIMO",
        lambda bi: Mamba3(8, d_state=4, headdim=4, mimo_rank=2, chunk_size=2, bidirectional=bi),
        _flip_sum_directions,
    ),
    ("GLA", lambda bi: GLA(8, n_heads=2, use_short_conv=True, chunk_size=4, bidirectional=bi), _flip_sum_directions),
    ("DeltaNet", lambda bi: DeltaNet(8, n_heads=2, chunk_size=4, bidirectional=bi), _flip_sum_directions),
    ("Gated DeltaNet", lambda bi: GatedDeltaNet(8, n_heads=2, chunk_size=4, bidirectional=bi), _flip_sum_directions),
    (
        "linear attention (Taylor)",
        lambda bi: LinearAttention(8, n_heads=2, feature_map="taylor", feature_dim=3, chunk_size=4, bidirectional=bi),
        _flip_sum_directions,
    ),
    (
        "linear attention (Hadamard)",
        lambda bi: LinearAttention(8, n_heads=2, feature_map="hadamard", chunk_size=4, bidirectional=bi),
        _flip_sum_directions,
    ),
    ("BaseConv", lambda bi: BaseConv(8, kernel_size=3, use_act=True, bidirectional=bi), _flip_sum_directions),
    # RWKV-4's WKV (the process's implementation, and chunks of 4 where chunked), at the depth of a second layer of three.
    ("RWKV", lambda bi: _placed(RWKV(8, init_layers=3, chunk_size=4, bidirectional=bi), 1), _flip_sum_directions),
    (
        "BaseConv (implicit long)",
        lambda bi: BaseConv(8, conv="implicit", l_max=16, bidirectional=bi),
        _flip_sum_directions,
    ),
    # Order 3 (two long convolutions); its two-sided kernels are not two steppable directions.
    ("Hyena", lambda bi: Hyena(8, l_max=16, order=3, filter_order=8, bidirectional=bi), None),
    # MAD's multi-head form: heads of 4, twice as wide inside, the projection tiled 3 times.
    (
        "Hyena (heads)",
        lambda bi: Hyena(8, l_max=16, filter_order=4, head_dim=4, inner_factor=2, proj_groups=3, bidirectional=bi),
        None,
    ),
    # H3 with S4D (heads of 2) and with S6 (the Mamba paper's "H3 with S6"): bidirectional, one two-sided
    # layer whose directions are not separately steppable.
    ("H3 (S4D)", lambda bi: H3(8, d_state=4, head_dim=2, inner="s4d", bidirectional=bi), None),
    ("H3 (S6)", lambda bi: H3(8, d_state=4, inner="s6", inner_options={"d_state": 3}, bidirectional=bi), None),
    ("attention", lambda bi: Attention(8, n_heads=2, bidirectional=bi), None),
    ("attention (blocks of 3)", lambda bi: Attention(8, n_heads=2, block_size=3, bidirectional=bi), None),
    ("attention (windows of 3)", lambda bi: Attention(8, n_heads=2, window=3, bidirectional=bi), None),
]

#: The length stepped through: odd, longer than S4's l_max and than two attention windows.
LENGTH = 11

_AVOID = "no setting avoids it: the layer's step mode disagrees with its forward; please report it with the output of `longrange info`"


def step_through(layer: torch.nn.Module, x: Tensor) -> Tensor:
    """The layer's outputs for x (batch, length, d) by its step mode from its default state (in x's
    device and dtype): what ``forward(x)`` must equal for a causal layer."""
    state = layer.default_state(x.shape[0], device=x.device, dtype=x.dtype)
    ys = []
    for t in range(x.shape[1]):
        y, state = layer.step(x[:, t], state)
        ys.append(y)
    return torch.stack(ys, dim=1)


def _step_case(
    name: str, build: Callable, split: Callable | None, bidirectional: bool, device: str, dtype: torch.dtype
) -> Case:
    def run() -> float:
        with torch.random.fork_rng(devices=[]):  # the layers' initialisation leaves the global generator alone
            torch.manual_seed(0)
            layer = build(bidirectional).double().eval()
        inputs = random_inputs(1, x=(2, LENGTH, layer.d_model))

        def forward(x: Tensor) -> Tensor:
            with scan.default_impl("ref"):  # S6's reference loop: independent of the scan's fast paths
                return layer(x)

        if not bidirectional:
            stepped = copy.deepcopy(layer).to(device=device, dtype=dtype)
            return compare(lambda x: step_through(stepped, x), forward, inputs, dtype, device)
        fwd, bwd, shifted = split(layer)
        fwd, bwd = (copy.deepcopy(m).to(device=device, dtype=dtype) for m in (fwd, bwd))

        def both(x: Tensor) -> Tensor:
            back = step_through(bwd, x.flip(1)).flip(1)
            if shifted:  # the backward kernel sees the inputs strictly after t
                back = torch.cat([back[:, 1:], torch.zeros_like(back[:, :1])], dim=1)
            return step_through(fwd, x) + back

        return compare(both, forward, inputs, dtype, device)

    direction = "both directions" if bidirectional else "causal"
    return Case(
        f"{name} step == forward",
        direction,
        device,
        dtype,
        f"batch 2, length {LENGTH}",
        run,
        TOLERANCE[dtype],
        lambda passed: _AVOID,
    )


def layer_cases(device: str, dtype: torch.dtype) -> list[Case]:
    """Every primitive of :data:`PRIMITIVES`: its step mode in ``dtype`` on ``device`` against its
    forward in float64 on the CPU, causal, and for bidirectional layers their two directions
    stepped against the bidirectional forward. float32 only (the step modes keep float32 and
    complex64 states)."""
    if dtype != torch.float32:
        return []
    return [
        _step_case(name, build, split, bidirectional, device, dtype)
        for name, build, split in PRIMITIVES
        for bidirectional in (False, True)
        if not (bidirectional and split is None)
    ]
