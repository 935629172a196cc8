"""``longrange info``: versions, devices, optional kernels and which implementation each op runs.

:func:`info_table` returns everything as a dict (JSON-able); :func:`format_info` prints it::

    longrange info [--json]

For every op with several implementations (every dispatcher in the registry of
:mod:`longrange.ops.dispatch`: the selective scan, the causal convolution, the Vandermonde and
Cauchy products of the S4D, DLR and S4 kernels, ...) and every available device, the table names
the implementation that ``impl="auto"`` runs there, as decided by the op's own dispatcher, and
lists every implementation that can run on each device; FFT convolutions have one implementation.
It ends by pointing to ``longrange check``, which verifies those implementations on the machine.
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
            rows.append(
                {
                    "device": f"cuda:{i}",
                    "name": props.name,
                    "memory_gib": round(props.total_memory / 2**30, 1),
                    "capability": f"{props.major}.{props.minor}",
                }
            )
    return rows


def _auto_note(d, device: str) -> str:
    """What ``impl="auto"`` of dispatcher ``d`` runs on ``device``, with the implementation's note
    and, where it takes only some inputs, what runs on the others (or the op's own words for its
    rule, :attr:`~longrange.ops.dispatch.Dispatcher.describe_auto`)."""
    if d.describe_auto is not None:
        return d.describe_auto(torch.device(device))
    auto = d.auto_impl(device)
    spec = d.specs[auto]
    text = f"{auto} ({spec.note})" if spec.note else auto
    if spec.fits is not None:
        deterministic = torch.are_deterministic_algorithms_enabled()
        others = [i for i in d.candidates(device, deterministic) if i != auto and d.specs[i].fits is None]
        if others:
            text += f", else {others[0]}"
    return text


def dispatch(device: str) -> dict[str, str]:
    """Per op (every registered dispatcher), the implementation ``impl="auto"`` runs on ``device``
    (with the fallbacks in words)."""
    from longrange.ops.dispatch import DISPATCHERS

    return {op: _auto_note(d, device) for op, d in DISPATCHERS.items()}


def implementations(device: str) -> dict[str, dict[str, Any]]:
    """Per registered op, on ``device``: the implementation ``impl="auto"`` runs, every
    implementation that can run there (``available``, in auto's order of preference) and those
    whose backward is deterministic."""
    from longrange.ops.dispatch import DISPATCHERS

    return {
        op: {
            "auto": d.auto_impl(device),
            "available": list(d.available_impls(device)),
            "deterministic_backward": list(d.deterministic_impls(device)),
        }
        for op, d in DISPATCHERS.items()
    }


def info_table() -> dict[str, Any]:
    """Everything ``longrange info`` prints: versions, optional packages, devices, dispatch."""
    import longrange.ops.scan.numba as numba_scan
    import longrange.ops.scan.triton as triton_scan
    from longrange import _optional
    from longrange.ops.conv import numba as conv_numba
    from longrange.ops.ssm_kernels import numba as ssm_numba
    from longrange.ops.ssm_kernels import triton as ssm_triton

    optional = _optional.status()
    triton_error = triton_scan.unavailable_reason()
    optional["scan_triton"] = {
        "installed": _optional.version("triton") is not None,
        "version": _optional.version("triton"),
        "extension": "longrange.ops.scan.triton (triton)",
        "extension_imports": triton_error is None,
        "usable": triton_error is None,
        **({"reason": triton_error} if triton_error else {}),
    }
    for name, module, label in (
        ("scan_numba", numba_scan, "longrange.ops.scan.numba"),
        ("conv_numba", conv_numba, "longrange.ops.conv.numba"),
        ("ssm_kernels_numba", ssm_numba, "longrange.ops.ssm_kernels.numba"),
    ):
        ok = module.numba_available()
        optional[name] = {
            "installed": _optional.version("numba") is not None,
            "version": _optional.version("numba"),
            "extension": f"{label} (numba)",
            "extension_imports": ok,
            "usable": ok,
            **({} if ok else {"reason": module.unavailable_reason()}),
        }
    ssm_triton_ok = ssm_triton._kernel_module() is not None
    optional["ssm_kernels_triton"] = {
        "installed": _optional.version("triton") is not None,
        "version": _optional.version("triton"),
        "extension": "longrange.ops.ssm_kernels.triton (triton)",
        "extension_imports": ssm_triton_ok,
        "usable": ssm_triton_ok,
        **({} if ssm_triton_ok else {"reason": ssm_triton.unavailable_reason("cuda")}),
    }
    devs = devices()
    return {
        "versions": versions(),
        "optional": optional,
        "devices": devs,
        "dispatch": {d["device"]: dispatch(d["device"]) for d in devs},
        "implementations": {d["device"]: implementations(d["device"]) for d in devs},
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
        extra = (
            f"{d['threads']} threads"
            if d["device"] == "cpu"
            else f"{d['memory_gib']} GiB, compute capability {d['capability']}"
        )
        parts.append(f"  {d['device']:8s} {d['name']} ({extra})")
    parts += ["", 'implementation run by impl="auto"']
    devs = list(table["dispatch"])
    ops = list(next(iter(table["dispatch"].values())))
    parts.append(_table(["op", *devs], [[op, *(table["dispatch"][d][op] for d in devs)] for op in ops]))
    parts += [
        "",
        "implementations that can run here (impl=...; auto's choice first; * marks a non-deterministic backward)",
    ]
    rows = []
    for op in next(iter(table["implementations"].values())):
        cells = []
        for d in devs:
            st = table["implementations"][d][op]
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
