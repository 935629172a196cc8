"""What makes two runs the same run: the identity of a resolved configuration, and its fingerprint.

A run's *identity* is its resolved configuration without what cannot change a result:

* presentation settings (:data:`VOLATILE`: ``train.progress``, ``train.log_every``, ...);
* the sections written by the run or derived from its data (:data:`NOT_IDENTITY`: ``record``,
  ``head``, the saved ``fingerprint``, and ``code``, where earlier releases kept their version);
* every field whose value equals its default. The owner of each section declares its defaults
  (:func:`declare_defaults`: ``train`` in ``train/config.py``, ``model`` in ``models/config.py``,
  ``task`` and ``objective`` in ``experiment/config.py``), so a field added by a new release with
  a default changes no existing identity, and a run made before it is still recognised.

The *fingerprint* is a short hash of the identity. Two configurations are the same run exactly
when :func:`differences` is empty; it names every differing field (a field left out at its default
is shown with its default value).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any

#: Settings that change how a run is shown or where it logs, not what it computes.
VOLATILE = {
    ("train", "progress"),
    ("train", "progress_every"),
    ("train", "log_every"),
    ("train", "num_workers"),
    ("train", "checkpoint_every"),
    ("train", "lock_stale_after"),
    ("train", "loggers"),
    ("train", "wandb"),
}
#: Top-level sections of config.yaml that are outcomes, derived values or the code's version.
NOT_IDENTITY = ("fingerprint", "record", "head", "code")

_DEFAULTS: dict[str, Callable[[], Mapping[str, Any]]] = {}
_PLAIN_DEFAULTS: dict[str, dict[str, Any]] = {}  # computed once per section, on first use


def declare_defaults(section: str, defaults: Callable[[], Mapping[str, Any]]) -> None:
    """Declare the default field values of a top-level section (a function returning them, called
    when first needed): fields at their default are left out of every identity."""
    _DEFAULTS[section] = defaults
    _PLAIN_DEFAULTS.pop(section, None)


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def defaults() -> dict[str, dict[str, Any]]:
    """The declared defaults of every section, as plain data."""
    for section, fn in _DEFAULTS.items():
        if section not in _PLAIN_DEFAULTS:
            _PLAIN_DEFAULTS[section] = _plain(dict(fn()))
    return dict(_PLAIN_DEFAULTS)


def identity(config: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a resolved configuration that determines the run's result, as plain data (as it
    reads back from config.yaml: tuples are lists, other objects their strings)."""
    out = {k: v for k, v in _plain(dict(config)).items() if k not in NOT_IDENTITY}
    for section, default in defaults().items():
        if isinstance(out.get(section), Mapping):
            out[section] = {k: v for k, v in out[section].items() if not (k in default and v == default[k])}
    for section, key in VOLATILE:
        if isinstance(out.get(section), Mapping) and key in out[section]:
            out[section] = {k: v for k, v in out[section].items() if k != key}
    return out


def fingerprint(config: Mapping[str, Any]) -> str:
    """A short hash of :func:`identity`."""
    text = json.dumps(identity(config), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """``field: old -> new`` for every dotted field whose value differs between two identities."""
    a, b = _flatten(identity(old)), _flatten(identity(new))
    known = {f"{section}.{k}": v for section, d in defaults().items() for k, v in d.items()}

    def shown(side: dict[str, Any], key: str) -> str:
        if key in side:
            return repr(side[key])
        return repr(known[key]) if key in known else "'<unset>'"

    return [
        f"{key}: {shown(a, key)} -> {shown(b, key)}"
        for key in sorted(set(a) | set(b))
        if a.get(key, "<unset>") != b.get(key, "<unset>")
    ]
