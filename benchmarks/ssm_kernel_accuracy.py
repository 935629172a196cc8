"""Accuracy of the fused Vandermonde and Cauchy kernels on long kernels, against a float64 reference and
beside a float32 direct sum; and, with ``--speed-against REV``, the speed of the numba kernels against
those of an earlier commit, interleaved in this one process.

Usage:
    python benchmarks/ssm_kernel_accuracy.py [--cases cauchy,vandermonde,vandermonde-long]
        [--impls numba,triton] [--triton-tiles gpu|interpret] [--N 128] [--L 262144] [--json OUT]
    python benchmarks/ssm_kernel_accuracy.py --speed-against REV [--repeats 7] [--threads 2]

Inputs are drawn as the S4 repository's kernel tests draw them (``extensions/kernels/test_cauchy.py``
and ``test_vandermonde.py`` of state-spaces/s4; seed 2357, batch 4):

- ``cauchy``: ``v``, ``w`` of N/2 standard complex normal entries (one member of each conjugate pair)
  and L points ``z = exp(i x)``, x standard normal, float32; the sum over both members of each pair
  (``conj_pairs=True``), N = 128 and L = 2^18 by default (``--N``, ``--L``);
- ``vandermonde``: weights ``v`` of N/2 standard complex normal entries and modes
  ``x = 0.001 u + i N u'`` (u, u' uniform), ``K[l] = Re sum v exp(l x)``, at the S4 test's largest
  N = 256 and L = 4096 (``--L`` below 4096 shortens it);
- ``vandermonde-long``: the same at L = 2^18 (``--L``), with the real part of x scaled by 4096 / L so
  that the powers grow no more than in the S4 test's longest case (at 0.001 they would overflow
  float32 at this length).

Errors are elementwise ``|x - ref| / |ref|``, the largest and the mean, of the output and of the
gradients the S4 tests check (of v and w for the Cauchy sum, of v and x for the Vandermonde product,
for a standard normal output gradient), as those tests measure them. The reference is computed in
float64 from the same float32 inputs; the float32 direct sum is the S4 tests' PyTorch formula in
complex64 (``(v / (z - w) + conj(v) / (z - conj(w))).sum(-1)``; ``(v exp(x l)).sum(-2).real``), its
gradients by autograd, both over pieces of at most 4096 points or positions (pieces' gradients added
in float64, so that the pieces add no error of their own). ``triton`` runs in Triton's interpreter on
the CPU (``TRITON_INTERPRET=1``) with the tiles of ``--triton-tiles`` (default ``gpu``: the tiles
the GPU runs, so the order of the sums is the GPU's; the interpreter's products are not fused into
multiply-adds as a GPU's are, except in the Cauchy kernels, which run unfused on a GPU too).

``--speed-against REV``: the numba kernels of this tree and of commit REV
(``src/longrange/ops/ssm_kernels/_numba_kernels.py`` as ``git show`` gives it; ``_cpu_kernels.py``
at commits before its rename), forward and backward,
alternating call by call (the order reversed every other round) on the S4 test's Cauchy case and on
an S4 layer's (4 vectors, 256 channels, 32 conjugate pairs, 2049 points) and S4D layer's shapes
(256 channels, 32 modes, length 4096); prints the ratios of the fastest and of the median calls,
new over old.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

C64, C128 = torch.complex64, torch.complex128
PIECE = 4096


# --------------------------------------------------------------------------------------------
# Inputs as the S4 tests draw them
# --------------------------------------------------------------------------------------------


def cauchy_inputs(N: int, L: int, batch: int = 4, seed: int = 2357) -> tuple[Tensor, Tensor, Tensor]:
    """(v, z, w): v, w (batch, N/2) one member of each conjugate pair, z (L,) on the unit circle."""
    torch.random.manual_seed(seed)
    v = torch.randn(batch, N // 2, dtype=C64)
    w = torch.randn(batch, N // 2, dtype=C64)
    z = torch.exp(1j * torch.randn(L, dtype=torch.float32))
    return v, z, w


def vandermonde_inputs(
    N: int, L: int, batch: int = 4, seed: int = 2357, growth_length: int | None = None
) -> tuple[Tensor, Tensor]:
    """(v, x): weights and modes (batch, N/2); the real part of x scaled by ``growth_length / L``."""
    torch.random.manual_seed(seed)
    v = torch.randn(batch, N // 2, dtype=C64)
    x = 0.001 * torch.rand(batch, N // 2) + 1j * N * torch.rand(batch, N // 2)
    if growth_length is not None:
        x = torch.complex(x.real * (growth_length / L), x.imag)
    return v, x


def output_gradient(shape: tuple[int, ...], complex_: bool, seed: int = 1) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    re = torch.randn(*shape, generator=g)
    return torch.complex(re, torch.randn(*shape, generator=g)) if complex_ else re


# --------------------------------------------------------------------------------------------
# The direct sums (float32: the baseline; float64: the reference), over pieces
# --------------------------------------------------------------------------------------------


def cauchy_direct(v: Tensor, z: Tensor, w: Tensor) -> Tensor:
    """The S4 tests' PyTorch Cauchy sum over conjugate pairs, in the inputs' dtype."""
    vv, zz, ww = v[..., None, :], z[:, None], w[..., None, :]
    return (vv / (zz - ww) + vv.conj() / (zz - ww.conj())).sum(-1)


def vandermonde_direct(v: Tensor, x: Tensor, l: Tensor, powers: torch.dtype | None = None) -> Tensor:
    """``Re sum_m v exp(x l)`` for the positions ``l``, in the inputs' dtype (the powers computed in
    ``powers``, if given, and rounded to it)."""
    if powers is None:
        p = torch.exp(x[..., None] * l)
    else:
        p = torch.exp(x.to(powers)[..., None] * l.to(torch.float64)).to(x.dtype)
    return (v[..., None] * p).sum(-2).real


def by_pieces(
    op: str, inputs: tuple[Tensor, ...], dout: Tensor, complex_dtype: torch.dtype, powers: torch.dtype | None = None
) -> tuple[Tensor, list[Tensor]]:
    """The direct sum of ``op`` in ``complex_dtype`` over pieces of the points (positions), and the
    gradients of ``<out, dout>`` with respect to v and w (x), added over the pieces in float64.
    ``powers``: the Vandermonde product's powers exp(x l) computed in that dtype, then rounded."""
    real = torch.float64 if complex_dtype == C128 else torch.float32
    leaves = [t.to(complex_dtype).detach().requires_grad_() for t in inputs[::2]]  # v and w (x)
    outs, grads, z_grads = [], [0, 0], []
    if op == "cauchy":
        z = inputs[1].to(complex_dtype).detach().requires_grad_()
        leaves.append(z)
        pieces = [
            (slice(i, i + PIECE), lambda s: cauchy_direct(leaves[0], z[s], leaves[1]))
            for i in range(0, z.shape[0], PIECE)
        ]
    else:
        L = dout.shape[-1]
        pieces = [
            (
                slice(i, i + PIECE),
                lambda s: vandermonde_direct(leaves[0], leaves[1], torch.arange(L, dtype=real)[s], powers),
            )
            for i in range(0, L, PIECE)
        ]
    for s, fn in pieces:
        out = fn(s)
        g = dout[..., s].to(out.dtype)
        piece_grads = torch.autograd.grad((out * g.conj()).real.sum(), leaves)
        outs.append(out.detach())
        grads = [a + b.to(C128) for a, b in zip(grads, piece_grads[:2])]
        if op == "cauchy":
            z_grads.append(piece_grads[2][s])
    return torch.cat(outs, -1), grads + ([torch.cat(z_grads)] if z_grads else [])


def run_impl(op: str, impl: str, inputs: tuple[Tensor, ...], dout: Tensor) -> tuple[Tensor, list[Tensor]]:
    from longrange.ops.ssm_kernels import cauchy, vandermonde_kernel

    leaves = [t.detach().clone().requires_grad_() for t in inputs[::2]]
    if op == "cauchy":
        leaves.append(inputs[1].detach().clone().requires_grad_())
        out = cauchy(leaves[0], leaves[2], leaves[1], conj_pairs=True, impl=impl)
    else:
        out = vandermonde_kernel(leaves[1], leaves[0], dout.shape[-1], impl=impl)
    grads = torch.autograd.grad((out * dout.to(out.dtype).conj()).real.sum(), leaves)
    return out.detach(), list(grads)


def errors(value: Tensor, reference: Tensor) -> tuple[float, float]:
    """The largest and the mean elementwise relative error."""
    rel = (value.to(reference.dtype) - reference).abs() / reference.abs()
    return rel.max().item(), rel.mean().item()


# --------------------------------------------------------------------------------------------
# Accuracy
# --------------------------------------------------------------------------------------------


def case_inputs(case: str, N: int | None, L: int | None) -> tuple[str, tuple[Tensor, ...], Tensor, str]:
    """(op, inputs (v, z, w) or (v, None, x), output gradient, description) of a case."""
    if case == "cauchy":
        N, L = N or 128, L or 2**18
        v, z, w = cauchy_inputs(N, L)
        return "cauchy", (v, z, w), output_gradient((v.shape[0], L), True), f"N={N} L={L}"
    if case == "vandermonde":
        N, L = N or 256, min(L or 4096, 4096)
        v, x = vandermonde_inputs(N, L)
        return "vandermonde", (v, None, x), output_gradient((v.shape[0], L), False), f"N={N} L={L}"
    if case == "vandermonde-long":
        N, L = N or 256, L or 2**18
        v, x = vandermonde_inputs(N, L, growth_length=4096)
        return (
            "vandermonde",
            (v, None, x),
            output_gradient((v.shape[0], L), False),
            f"N={N} L={L}, Re x scaled by 4096/L",
        )
    raise SystemExit(f"unknown case {case!r}")


def measure_case(case: str, impls: list[str], N: int | None, L: int | None) -> list[dict]:
    op, inputs, dout, shape = case_inputs(case, N, L)
    names = ("out", "dv", "dw", "dz") if op == "cauchy" else ("out", "dv", "dx")
    ref_out, ref_grads = by_pieces(op, inputs, dout, C128)
    refs = [ref_out, *ref_grads]
    results = {"float32 direct sum": by_pieces(op, inputs, dout, C64)}
    if op == "vandermonde":  # the phases l Im(x) lose digits in float32: also the sum of exact powers
        results["float32 sum of float64 powers"] = by_pieces(op, inputs, dout, C64, powers=C128)
    for impl in impls:
        start = time.perf_counter()
        if impl == "triton-float64":  # the Triton kernels computing in float64 (DEFAULT_CONFIG float64)
            from longrange.ops.ssm_kernels import triton as ssm_triton

            config = ssm_triton.DEFAULT_CONFIG["interpret"]
            config["float64"] = True
            try:
                results[impl] = run_impl(op, "triton", inputs, dout)
            finally:
                config["float64"] = False
        else:
            results[impl] = run_impl(op, impl, inputs, dout)
        print(f"  {case} {impl}: {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    rows = []
    for name, (out, grads) in results.items():
        row = {"case": case, "shape": shape, "impl": name}
        for what, value, ref in zip(names, [out, *grads], refs):
            row[f"{what}_max"], row[f"{what}_mean"] = errors(value, ref)
        rows.append(row)
    return rows


def markdown(rows: list[dict]) -> str:
    """One Markdown table per case: the largest and the mean relative error of each compared tensor."""
    tables = []
    for case in dict.fromkeys(r["case"] for r in rows):
        mine = [r for r in rows if r["case"] == case]
        keys = [k for k in mine[0] if k.endswith(("_max", "_mean"))]
        head = ["implementation"] + [k.replace("_", " ") for k in keys]
        lines = [f"**{case}** ({mine[0]['shape']})", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join([r["impl"]] + [f"{r[k]:.2g}" for k in keys]) + " |" for r in mine]
        tables.append("\n".join(lines))
    return "\n\n".join(tables)


# --------------------------------------------------------------------------------------------
# Speed against an earlier commit
# --------------------------------------------------------------------------------------------


#: Where the numba kernels of the SSM-kernel products are, and were before their rename.
KERNEL_PATHS = ("src/longrange/ops/ssm_kernels/_numba_kernels.py", "src/longrange/ops/ssm_kernels/_cpu_kernels.py")


def load_kernels_at(rev: str):
    """The numba kernel module ``_numba_kernels`` (formerly ``_cpu_kernels``) as it was at commit
    ``rev``, imported from a copy."""
    root = Path(__file__).resolve().parent.parent
    for kernel_path in KERNEL_PATHS:
        shown = subprocess.run(["git", "show", f"{rev}:{kernel_path}"], cwd=root, capture_output=True, text=True)
        if shown.returncode == 0:
            source = shown.stdout
            break
    else:
        raise RuntimeError(f"commit {rev}: none of {', '.join(KERNEL_PATHS)} ({shown.stderr.strip()})")
    path = Path(tempfile.mkdtemp()) / f"_numba_kernels_{rev.replace('/', '_')}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def kernel_calls(
    module, v: Tensor, z: Tensor, w: Tensor, a: Tensor, W: Tensor, L: int
) -> dict[str, Callable[[], None]]:
    """Forward and backward of both products through ``module``'s kernels, with the arguments the
    wrappers of :mod:`longrange.ops.ssm_kernels.numba` give them (canonical layouts, float32)."""
    from longrange.ops.ssm_kernels import numba as ssm_numba

    np_ = lambda t: t.detach().contiguous().numpy()  # noqa: E731
    parts = lambda t: (np_(t.real), np_(t.imag))  # noqa: E731
    J, R, N = v.shape
    K = z.shape[1]
    block = ssm_numba._points_per_task(R, K)
    blocks = -(-K // block)
    partial = torch.float64 if getattr(module, "PARTIAL_SUM_DTYPE", None) is not None else torch.float32
    out = [torch.empty(J, R, K).numpy() for _ in range(2)]
    g = parts(torch.complex(torch.randn(J, R, K), torch.randn(J, R, K)))
    gv = [torch.empty(blocks, J, R, N, dtype=partial).numpy() for _ in range(2)]
    gw = [torch.empty(blocks, R, N, dtype=partial).numpy() for _ in range(2)]
    gz = [torch.empty(R, K).numpy() for _ in range(2)]
    cauchy_args = (*parts(v), *parts(z), *parts(w))
    Jw, Rw, M = W.shape
    step = min(ssm_numba.VANDERMONDE_BLOCK, L)
    d, D = ssm_numba._steps(a.real, a.imag, step)
    groups = -(-Jw // ssm_numba.VANDERMONDE_ROWS_PER_TASK)
    k_out = torch.empty(Jw, Rw, L).numpy()
    k_g = torch.randn(Jw, Rw, L).numpy()
    gW = [torch.empty(Jw, Rw, M).numpy() for _ in range(2)]
    ga = [torch.empty(Rw, groups, M, dtype=torch.float64).numpy() for _ in range(2)]
    w_parts = parts(W)
    return {
        "cauchy forward": lambda: module.cauchy_forward(*cauchy_args, True, block, *out),
        "cauchy backward": lambda: module.cauchy_backward(*cauchy_args, *g, True, block, *gv, *gw, *gz),
        "vandermonde forward": lambda: module.vandermonde_forward(
            *d, *D, *w_parts, ssm_numba.VANDERMONDE_BLOCK, ssm_numba.VANDERMONDE_ROWS_PER_TASK, k_out
        ),
        "vandermonde backward": lambda: module.vandermonde_backward(
            *d, *D, *w_parts, k_g, ssm_numba.VANDERMONDE_BLOCK, ssm_numba.VANDERMONDE_ROWS_PER_TASK, *gW, *ga
        ),
    }


def speed(rev: str, repeats: int) -> list[dict]:
    from longrange.ops.ssm_kernels import _numba_kernels as new

    old = load_kernels_at(rev)
    cplx = lambda *s: torch.complex(torch.randn(*s), torch.randn(*s))  # noqa: E731
    torch.manual_seed(0)
    v, z, w = cauchy_inputs(128, 2**18)
    s4_test = (v[None], z.expand(4, -1), w)
    layer = (
        cplx(4, 256, 32),
        torch.complex(0.2 * torch.rand(256, 2049), 4 * torch.randn(256, 2049)),
        torch.complex(-0.5 - torch.rand(256, 32), 3 * torch.randn(256, 32)),
    )
    modes = torch.complex(
        -0.05 - 0.1 * torch.rand(256, 32), torch.pi * torch.arange(32.0) * 0.01 + 0.01 * torch.randn(256, 32)
    )
    rows = []
    for label, (cv, cz, cw) in (("S4 test N=128 L=2^18", s4_test), ("S4 layer", layer)):
        calls = {
            "old": kernel_calls(old, cv, cz, cw, modes.to(C64), cplx(1, 256, 32), 4096),
            "new": kernel_calls(new, cv, cz, cw, modes.to(C64), cplx(1, 256, 32), 4096),
        }
        names = [n for n in calls["new"] if n.startswith("cauchy") or label == "S4 layer"]
        for name in names:
            times = {"old": [], "new": []}
            for version in ("old", "new"):  # compile or load, untimed
                calls[version][name]()
            for r in range(repeats):
                for version in ("old", "new") if r % 2 == 0 else ("new", "old"):
                    start = time.process_time()
                    calls[version][name]()
                    times[version].append(time.process_time() - start)
            row = {
                "shape": label if name.startswith("cauchy") else "S4D layer H=256 M=32 L=4096",
                "kernel": name,
                "old_min_s": min(times["old"]),
                "new_min_s": min(times["new"]),
                "old_median_s": statistics.median(times["old"]),
                "new_median_s": statistics.median(times["new"]),
            }
            row["ratio_min"] = row["new_min_s"] / row["old_min_s"]
            row["ratio_median"] = row["new_median_s"] / row["old_median_s"]
            rows.append(row)
            print(
                f"{row['shape']:32s} {name:22s} old {row['old_min_s']:.4f} s  new {row['new_min_s']:.4f} s  "
                f"new/old {row['ratio_min']:.2f} (medians {row['ratio_median']:.2f})",
                flush=True,
            )
    return rows


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default="cauchy,vandermonde,vandermonde-long", help="comma-separated cases")
    p.add_argument(
        "--impls",
        default="numba,triton,triton-float64",
        help="comma-separated implementations (triton: in the interpreter; triton-float64: its float64 mode)",
    )
    p.add_argument("--triton-tiles", default="gpu", choices=("gpu", "interpret"), help="tile sizes Triton runs with")
    p.add_argument("--N", type=int, default=None, help="state size (default per case)")
    p.add_argument("--L", type=int, default=None, help="length / points of the long cases (default 2^18)")
    p.add_argument("--threads", type=int, default=2, help="torch and numba threads (default 2)")
    p.add_argument("--speed-against", metavar="REV", help="time the numba kernels against those of commit REV instead")
    p.add_argument("--repeats", type=int, default=7, help="timed rounds of --speed-against (default 7)")
    p.add_argument("--json", metavar="OUT", help="write the rows as JSON")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.speed_against:
        rows = speed(args.speed_against, args.repeats)
    else:
        impls = [i for i in args.impls.split(",") if i]
        if any(i.startswith("triton") for i in impls):
            # Triton imported before the interpreter is asked for: its own sum (tl.reduce's combine
            # function) stays the compiled one, which the interpreter runs with numpy's pairwise sum
            # (the order of a GPU's tree reduction), not one element at a time
            import longrange.ops.ssm_kernels._triton_kernels  # noqa: F401
            from longrange.ops.ssm_kernels import triton as ssm_triton

            os.environ["TRITON_INTERPRET"] = "1"

            ssm_triton.DEFAULT_CONFIG["interpret"] = dict(ssm_triton.DEFAULT_CONFIG[args.triton_tiles])
        rows = [r for case in args.cases.split(",") if case for r in measure_case(case, impls, args.N, args.L)]
        print(markdown(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": vars(args), "rows": rows}, indent=1))
    return {"rows": rows}


if __name__ == "__main__":
    main()
