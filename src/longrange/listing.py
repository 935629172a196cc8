"""``longrange list``: everything registered, with its options and their defaults.

    longrange list                      every kind, each name with its one-line description
    longrange list primitives           each primitive with its options and defaults
    longrange list primitive gla        one entry: its description and options
    longrange list ops                  each op with its implementations and what runs here

Plugins (``LONGRANGE_PLUGINS``, or packages that declare a ``longrange-plugins`` entry point) are
imported first, so their names are listed beside the built-in ones.
"""

from __future__ import annotations

import argparse
import inspect
from typing import Any

from longrange.errors import ConfigError
from longrange.typed import did_you_mean


def _registries() -> dict[str, tuple[Any, int]]:
    """kind (plural) -> (registry, positional arguments its builder passes before the options)."""
    import longrange.data  # noqa: F401  (registers the tasks)
    from longrange.data.tasks import TASKS
    from longrange.models.registry import BLOCKS, HEADS, PRIMITIVES
    from longrange.objectives.base import OBJECTIVES

    return {
        "primitives": (PRIMITIVES, 1),
        "blocks": (BLOCKS, 1),
        "heads": (HEADS, 2),
        "objectives": (OBJECTIVES, 0),
        "tasks": (TASKS, 0),
    }


KINDS = ("primitives", "blocks", "heads", "objectives", "tasks", "ops")


def _summary(obj: Any) -> str:
    """The first paragraph of ``obj``'s docstring, or of its module's where the docstring points there."""
    doc = inspect.getdoc(obj) or ""
    if "module doc" in doc or not doc:
        module = inspect.getmodule(obj)
        doc = inspect.getdoc(module) if module is not None else doc
    return (doc or "").strip().split("\n\n")[0].replace("\n", " ")


def _default(value: Any) -> str:
    return "(required)" if value is inspect.Parameter.empty else repr(value)


def _entry_options(kind: str, registry: Any, name: str, n_args: int) -> dict[str, Any]:
    if kind == "tasks":
        return dict(registry.get(name).options)
    if kind == "blocks":
        return {}  # a block is built from the whole model config
    return registry.options(name, n_args)


def _entry_text(kind: str, registry: Any, name: str, n_args: int, detailed: bool) -> list[str]:
    entry = registry.get(name)
    target = entry.spec if kind == "tasks" else entry
    summary = _summary(target)
    if kind == "tasks":
        from longrange.data.tasks import get_spec

        summary = get_spec(name).description or summary
    lines = [f"  {name}" + (f": {summary}" if summary else "")]
    options = _entry_options(kind, registry, name, n_args)
    if detailed and options:
        width = max(len(k) for k in options)
        notes = getattr(target, "OPTION_NOTES", {})  # what a default of None means (primitives)
        lines += [
            f"      {k.ljust(width)}  {_default(v)}" + (f"  ({notes[k]})" if v is None and k in notes else "")
            for k, v in options.items()
        ]
    return lines


def _ops_text(detailed: bool, only: str | None = None) -> list[str]:
    import torch

    from longrange.ops.dispatch import DISPATCHERS

    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    lines = []
    for op in DISPATCHERS:
        if only is not None and op != only:
            continue
        d = DISPATCHERS[op]
        # the op's own words where its rule reads more than the device (e.g. the size of the inputs)
        auto = d.describe_auto(torch.device(devices[-1])) if d.describe_auto else d.auto_impl(devices[-1])
        lines.append(f"  {op}: {', '.join(d.impls)} (auto on {devices[-1]}: {auto})")
        if detailed:
            for impl in d.impls:
                where = [dev for dev in devices if d.runs(impl, dev)]
                why = "" if where else f" - {d.unavailable_reason(impl, devices[0])}"
                note = d.specs[impl].note
                lines.append(
                    f"      {impl}: runs on {', '.join(where) or 'nothing here'}{why}" + (f" ({note})" if note else "")
                )
    return lines


def listing(kind: str | None = None, name: str | None = None) -> str:
    """The text ``longrange list [KIND [NAME]]`` prints."""
    from longrange.registry import load_plugins

    load_plugins()
    if kind is not None and kind not in KINDS:
        singular = {k[:-1]: k for k in KINDS}
        if kind in singular:
            kind = singular[kind]
        else:
            raise ConfigError(
                f"unknown kind {kind!r}{did_you_mean(kind, KINDS, quote=True)}; kinds: {', '.join(KINDS)}"
            )
    if kind == "ops":
        if name is not None:
            from longrange.ops.dispatch import dispatcher

            name = dispatcher(name).op  # an unknown op: the error suggests the closest
        return "\n".join(["ops:", *_ops_text(True, name)])
    registries = _registries()
    out: list[str] = []
    for k, (registry, n_args) in registries.items():
        if kind is not None and k != kind:
            continue
        names = registry.names()
        if name is not None:
            registry.get(name)  # an unknown name: the registry's error, with "did you mean"
            names = [name]
        out.append(f"{k}:")
        for n in names:
            out += _entry_text(k, registry, n, n_args, detailed=kind is not None)
        if k == "blocks" and name is None:
            from longrange.models.config import CHANNEL_MIXERS

            out.append(
                f"  (in model.layers, channel mixers as layers of their own: "
                f"{', '.join(f'{n} ({mlp} MLP)' for n, mlp in CHANNEL_MIXERS.items())})"
            )
    if kind is None:
        out += ["ops:", *_ops_text(False)]
        out.append("")
        out.append(
            "`longrange list KIND` adds each entry's options and defaults; `longrange list KIND NAME` one entry."
        )
    return "\n".join(out)


def _list(args: argparse.Namespace) -> int:
    print(listing(args.kind, args.name))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "list",
        help="everything registered (primitives, blocks, heads, objectives, tasks, ops), with options and defaults",
        description="Lists the registered names of each kind, plugins included; with a KIND, each "
        "entry's options and their defaults; with a NAME, that entry alone.",
    )
    p.add_argument("kind", nargs="?", help=f"one of {', '.join(KINDS)} (singular also accepted)")
    p.add_argument("name", nargs="?", help="one entry of that kind")
    p.set_defaults(func=_list)
