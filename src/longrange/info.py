"""``longrange info``: versions, devices, optional kernels and which implementation each op runs.

:func:`info_table` returns everything as a dict (JSON-able); :func:`format_info` prints it::

    longrange info [--json]

For every op with several implementations (the selective scan, the causal convolution, the
Vandermonde and Cauchy products of the S4D, DLR and S4 kernels, FFT convolutions) and every
available device, the table names the implementation that ``impl="auto"`` runs there, as decided
by the ops' own ``auto_impl`` functions; for the SSM-kernel products it also lists every
implementation that can run on each device. It ends by pointing to ``longrange check``, which verifies
those implementations on the machine.
"""
from __future__ import annotations

import argparse
import json
import platform
from typing import Any

import torch


def _imports(module: str) -> tuple[bool, str | None]:
    try:
        __import__(module)
    except Exception as err:  # ImportError, or a broken install
        return False, f"{type(err).__name__}: {err}"
    return True, None


def versions() -> dict[str, str]:
    """Versions of Python, longrange, torch, CUDA (torch's build), numpy, numba and triton."""
    from longrange import __version__, _optional

    cuda = torch.version.cuda
    out = {
        "python": platform.python_version(),
        "longrange": __version__,
        "torch": torch.__version__,
        "CUDA (torch build)": cuda if cuda else "none (CPU build)",
    }
    if torch.cuda.is_available() and torch.backends.cudnn.is_available():
        out["cuDNN"] = str(torch.backends.cudnn.version())
    for name in ("numpy", "numba", "triton"):
        version = _optional.version(name)
        if version is None:
            out[name] = "not installed"
        else:
            ok, error = _imports(name)
            out[name] = version if ok else f"{version} (does not import: {error})"
    return out


def devices() -> list[dict[str, Any]]:
    """The devices torch can use: the CPU, then every CUDA device."""
    from longrange.bench.measure import environment

    rows = [{"device": "cpu", "name": environment()["cpu"], "threads": torch.get_num_threads()}]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            rows.append({
                "device": f"cuda:{i}", "name": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
                "capability": f"{props.major}.{props.minor}",
            })
    return rows


def dispatch(device: str) -> dict[str, str]:
    """Per op, the implementation ``impl="auto"`` runs on ``device`` (with the fallbacks in words)."""
    from longrange.ops import conv, scan
    from longrange.ops.ssm_kernels import auto_impl

    scan_impl = scan.auto_impl(device)
    scan_note = scan_impl
    if scan_impl == "cuda":
        other = scan.auto_impl(device, has_initial_state=True)
        scan_note = f"cuda (mamba_ssm); {other} with an initial state or float64"
    conv_impl = conv.auto_impl(device)
    conv_note = {"cuda": "cuda (causal-conv1d) for widths 2-4, else torch",
                 "numba": "numba (float32, float64), else torch"}.get(conv_impl, conv_impl)
    return {
        "selective_scan": scan_note,
        "causal_conv1d": conv_note,
        "S4D/DLR Vandermonde kernel": auto_impl("vandermonde", device),
        "S4 Cauchy kernel": auto_impl("cauchy", device),
        "fft_conv": "torch.fft",
    }


def ssm_kernel_impls(device: str) -> dict[str, dict[str, Any]]:
    """Per SSM-kernel product (``vandermonde``, ``cauchy``), on ``device``: the implementation
    ``impl="auto"`` runs, every implementation that can run there (``available``, in auto's order
    of preference) and those whose backward is deterministic."""
    from longrange.ops import ssm_kernels

    return {
        op: {
            "auto": ssm_kernels.auto_impl(op, device),
            "available": ssm_kernels.available_impls(op, device),
            "deterministic_backward": [i for i in ssm_kernels.available_impls(op, device) if ssm_kernels.DETERMINISTIC_BACKWARD[op][i]],
        }
        for op in ssm_kernels.OPS
    }


def info_table() -> dict[str, Any]:
    """Everything ``longrange info`` prints: versions, optional packages, devices, dispatch."""
    from longrange import _optional
    import longrange.ops.scan.numba as numba_scan
    import longrange.ops.scan.triton as triton_scan
    from longrange.ops.ssm_kernels import cpu as ssm_cpu
    from longrange.ops import conv_numba
    from longrange.ops.ssm_kernels import triton as ssm_triton

    optional = _optional.status()
    triton_error = triton_scan.unavailable_reason()
    optional["scan_triton"] = {
        "installed": _optional.version("triton") is not None, "version": _optional.version("triton"), "extension": "longrange.ops.scan.triton (triton)",
        "extension_imports": triton_error is None, "usable": triton_error is None,
        **({"reason": triton_error} if triton_error else {}),
    }
    for name, module, label in (("scan_numba", numba_scan, "longrange.ops.scan.numba"),
                                ("conv_numba", conv_numba, "longrange.ops.conv_numba"),
                                ("ssm_kernels_numba", ssm_cpu, "longrange.ops.ssm_kernels.cpu")):
        ok = module.numba_available()
        optional[name] = {
            "installed": _optional.version("numba") is not None, "version": _optional.version("numba"),
            "extension": f"{label} (numba)", "extension_imports": ok, "usable": ok,
            **({} if ok else {"reason": module.unavailable_reason()}),
        }
    ssm_triton_ok = ssm_triton._kernel_module() is not None
    optional["ssm_kernels_triton"] = {
        "installed": _optional.version("triton") is not None, "version": _optional.version("triton"),
        "extension": "longrange.ops.ssm_kernels.triton (triton)", "extension_imports": ssm_triton_ok, "usable": ssm_triton_ok,
        **({} if ssm_triton_ok else {"reason": ssm_triton.unavailable_reason("cuda")}),
    }
    devs = devices()
    return {
        "versions": versions(),
        "optional": optional,
        "devices": devs,
        "dispatch": {d["device"]: dispatch(d["device"]) for d in devs},
        "ssm_kernels": {d["device"]: ssm_kernel_impls(d["device"]) for d in devs},
    }


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def format_info(table: dict[str, Any]) -> str:
    """The text ``longrange info`` prints."""
    parts = ["versions"]
    parts += [f"  {k:20s} {v}" for k, v in table["versions"].items()]
    parts += ["", "optional kernels"]
    rows = []
    for name, st in table["optional"].items():
        state = "yes" if st["usable"] else f"no: {st.get('reason', '')}"
        rows.append([name, st.get("version") or "-", st["extension"], state])
    parts.append(_table(["package", "version", "compiled part", "usable"], rows))
    parts += ["", "devices"]
    for d in table["devices"]:
        extra = f"{d['threads']} threads" if d["device"] == "cpu" else f"{d['memory_gib']} GiB, compute capability {d['capability']}"
        parts.append(f"  {d['device']:8s} {d['name']} ({extra})")
    parts += ["", 'implementation run by impl="auto"']
    devs = list(table["dispatch"])
    ops = list(next(iter(table["dispatch"].values())))
    parts.append(_table(["op", *devs], [[op, *(table["dispatch"][d][op] for d in devs)] for op in ops]))
    parts += ["", "SSM-kernel implementations that can run here (impl=...; auto's choice first; * marks a non-deterministic backward)"]
    rows = []
    for op in next(iter(table["ssm_kernels"].values())):
        cells = []
        for d in devs:
            st = table["ssm_kernels"][d][op]
            names = [st["auto"]] + [i for i in st["available"] if i != st["auto"]]
            cells.append(", ".join(i if i in st["deterministic_backward"] else f"{i}*" for i in names))
        rows.append([op, *cells])
    parts.append(_table(["op", *devs], rows))
    parts += ["", "longrange check: verify every implementation available here against its float64 reference (--quick)"]
    return "\n".join(parts)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "info",
        help="versions, devices, optional kernels, and which implementation each op runs where",
        description="Print the versions of longrange and its dependencies, the devices, whether the optional "
        "compiled kernels import, and for each op the implementation impl='auto' runs on each device.",
    )
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    table = info_table()
    print(json.dumps(table, indent=1) if args.json else format_info(table))
    return 0
