"""Typed configuration: plain values (YAML, the command line) converted by a dataclass's annotations.

Every configuration section (model, task, objective, compare, train) is a dataclass; :func:`from_dict`
builds one from a mapping, converting each value to its field's declared type and raising a one-line
:class:`~longrange.errors.ConfigError` that names the dotted field for an unknown key or a value of the
wrong type, before any data is loaded::

    from_dict(ModelConfig, {"d_model": "16", "n_layers": 1.0}, "model")   # d_model=16, n_layers=1
    from_dict(ModelConfig, {"d_model": 2.5}, "model")
    # ConfigError: model.d_model must be an integer, got 2.5

Conversions: ``int`` accepts integers, integral floats (``1.0``) and integer strings (``"16"``);
``float`` accepts numbers and numeric strings (YAML 1.1 reads ``1e-3`` as a string); ``bool`` accepts
booleans and the strings ``true``/``false`` (any case), nothing else, so ``"false"`` can never mean
true; ``str`` accepts strings only; ``X | None`` accepts ``None``; ``list[X]``/``tuple[X, ...]`` accept
lists and tuples (converted element by element); ``dict[str, X]`` accepts mappings; a nested
dataclass accepts a mapping (converted recursively); ``Any`` accepts anything.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar, Union

from longrange.errors import ConfigError

T = TypeVar("T")

_TYPE_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """The resolved annotations of a dataclass (resolved once per class: they never change)."""
    return typing.get_type_hints(cls)


def field_types(cls: type) -> dict[str, Any]:
    """The resolved annotations of a dataclass's fields (what :func:`convert` takes as ``tp``)."""
    return _hints(cls)


def did_you_mean(name: str, known: typing.Iterable[str], quote: bool = False) -> str:
    """`` (did you mean x or y?)`` for the closest known names (quoted as ``'x'`` with ``quote``), or ''."""
    close = difflib.get_close_matches(str(name), list(known), n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(c) if quote else c for c in close)}?)" if close else ""


def env_choice(name: str, choices: typing.Sequence[str]) -> str:
    """The environment variable ``name`` as one of ``choices`` (any case; unset or empty: the first,
    the default); anything else is a ConfigError naming the variable and what it may be."""
    value = os.environ.get(name, "").strip().lower() or choices[0]
    if value not in choices:
        others = " or ".join(repr(c) for c in choices[1:])
        raise ConfigError(f"{name}={os.environ[name]!r}: expected {choices[0]!r} (the default) or {others}")
    return value


def unknown_fields_error(unknown: typing.Sequence[str], known: typing.Iterable[str], where: str) -> ConfigError:
    known = sorted(known)
    prefix = f"{where}." if where else ""
    parts = [f"{prefix}{u}{did_you_mean(u, known)}" for u in unknown]
    return ConfigError(f"unknown field(s) {', '.join(parts)}; known: {', '.join(known)}")


def _describe(tp: Any) -> str:
    if tp in _TYPE_NAMES:
        return _TYPE_NAMES[tp]
    origin = typing.get_origin(tp)
    if origin in (list, tuple):
        return "a list"
    if origin in (dict, Mapping) or tp is dict:
        return "a mapping"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    if origin is typing.Literal:
        return " or ".join(map(repr, typing.get_args(tp)))
    return getattr(tp, "__name__", str(tp))


def convert(value: Any, tp: Any, where: str) -> Any:
    """``value`` converted to the annotation ``tp``; ConfigError naming ``where`` if it cannot be."""
    if tp is Any or tp is object:
        return value
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Union or (hasattr(types, "UnionType") and isinstance(tp, types.UnionType)):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        errors = []
        # Try exact type matches first (so 3 stays an int in ``int | float``), then conversions.
        for option in sorted(options, key=lambda a: not _exact(value, a)):
            try:
                return convert(value, option, where)
            except ConfigError as err:
                errors.append(err)
        allowed = " or ".join(_describe(a) for a in options) + (" or null" if type(None) in args else "")
        raise ConfigError(f"{where} must be {allowed}, got {value!r}")
    if typing.get_origin(tp) is typing.Literal:
        if value in args:
            return value
        raise ConfigError(f"{where} must be one of {', '.join(map(repr, args))}, got {value!r}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        raise ConfigError(f"{where} must be true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{where} must be an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        raise ConfigError(f"{where} must be an integer, got {value!r}")
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"{where} must be a number, got {value!r}")
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                pass
        raise ConfigError(f"{where} must be a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where} must be a string, got {value!r}")
    if origin in (list, tuple) or tp in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} must be a list, got {value!r}")
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            if len(value) != len(args):
                raise ConfigError(f"{where} must be a list of {len(args)} values, got {value!r}")
            return tuple(convert(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
        item = args[0] if args else Any
        items = [convert(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if (origin is tuple or tp is tuple) else items
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where} must be a mapping, got {value!r}")
        val_tp = args[1] if len(args) == 2 else Any
        return {str(k): convert(v, val_tp, f"{where}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        return from_dict(tp, value, where)
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise ConfigError(f"{where} must be {_describe(tp)}, got {value!r}")


def _exact(value: Any, tp: Any) -> bool:
    if tp is float:
        return isinstance(value, float)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(tp, type) and isinstance(value, tp)


def from_dict(cls: type[T], data: Any, where: str = "") -> T:
    """An instance of the dataclass ``cls`` from a mapping of plain values (see the module docstring).

    Missing fields take their defaults; ``where`` is the dotted prefix used in error messages
    (``"model"`` gives ``model.d_model``). The dataclass's own ``__post_init__`` checks ranges and
    choices after conversion.
    """
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where or cls.__name__} must be a mapping of field names to values, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [str(k) for k in data if k not in fields]
    if unknown:
        raise unknown_fields_error(unknown, fields, where)
    hints = _hints(cls)
    prefix = f"{where}." if where else ""
    kwargs = {name: convert(value, hints[name], f"{prefix}{name}") for name, value in data.items()}
    return cls(**kwargs)
