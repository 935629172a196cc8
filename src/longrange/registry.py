"""Registries of the extension points: primitives, blocks, heads, objectives and tasks.

A registry maps names to what builds them (a class, or a function). Registering is one decorator
in the module that defines the class; importing that module is what registers it::

    from longrange.layers import SequencePrimitive, register_primitive

    @register_primitive("moving-average")
    class MovingAverage(SequencePrimitive):
        def __init__(self, d_model: int, width: int = 4): ...

    PRIMITIVES.build("moving-average", 64, width=8)      # options checked before construction

A registry reads like a mapping from names to entries: ``name in PRIMITIVES``, ``list(PRIMITIVES)``
(the names, sorted), ``PRIMITIVES[name]``.

Your own extensions: import your module before building, e.g. ``import mypkg.layers``. At the
first lookup in any registry, the command line (and every worker process it starts) imports

* the modules that installed packages declare as entry points of the group :data:`ENTRY_POINT_GROUP`
  (``longrange-plugins``): a plugin package installed once is found by every command, e.g. in its
  ``pyproject.toml``::

      [project.entry-points."longrange-plugins"]
      mypkg = "mypkg.layers"

* and the modules named in the environment variable :data:`PLUGINS_ENV`,
  ``LONGRANGE_PLUGINS=mypkg.layers,mypkg.tasks`` (for code that is not installed).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar

from longrange.errors import ConfigError
from longrange.typed import did_you_mean

T = TypeVar("T")

#: Environment variable naming modules (comma-separated) imported at the first registry lookup.
PLUGINS_ENV = "LONGRANGE_PLUGINS"
#: The entry-point group whose modules are imported at the first registry lookup.
ENTRY_POINT_GROUP = "longrange-plugins"
#: What an unknown name's error adds: how a name of one's own is registered.
PLUGIN_HINT = (
    f"a name of your own is registered by importing its module: an installed package's "
    f"'{ENTRY_POINT_GROUP}' entry point, or {PLUGINS_ENV}=mypkg.module on the command line "
    "(see docs/extending.md)"
)

_plugins_loaded: set[str] = set()
_entry_points_loaded = False


def load_entry_points() -> list[str]:
    """Import, once per process, the modules of the installed packages' ``longrange-plugins`` entry
    points; returns the entry points' names. One that fails to import is a ConfigError naming it,
    its module and its distribution."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return []
    _entry_points_loaded = True  # before importing: a plugin's own lookups must not re-enter
    import importlib.metadata

    loaded = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(getattr(ep, "dist", None), "name", None) or "an installed package"
        try:
            ep.load()
        except Exception as err:
            raise ConfigError(
                f"the {ENTRY_POINT_GROUP} entry point {ep.name!r} of {dist} ({ep.value}) failed to "
                f"import: {type(err).__name__}: {err}"
            ) from err
        loaded.append(ep.name)
    return loaded


def load_plugins() -> list[str]:
    """Import the installed plugins (:func:`load_entry_points`) and the modules named in
    ``$LONGRANGE_PLUGINS`` that are not imported yet; returns the names of the latter.

    A name that is not an importable module is a ConfigError; an error raised while importing an
    existing module propagates unchanged.
    """
    load_entry_points()
    names = [n.strip() for n in os.environ.get(PLUGINS_ENV, "").replace(";", ",").split(",") if n.strip()]
    new = [n for n in names if n not in _plugins_loaded]
    for name in new:
        _plugins_loaded.add(name)  # before importing: a plugin's own lookups must not re-enter
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # its parent package is missing
            found = False
        if not found:
            _plugins_loaded.discard(name)
            raise ConfigError(f"{PLUGINS_ENV} names the module {name!r}, which cannot be found (is it on PYTHONPATH?)")
        importlib.import_module(name)
    return new


def unknown_option(key: str, what: str, valid: Sequence[str]) -> ConfigError:
    """The error for an option that ``what`` (e.g. "task listops") does not take."""
    return ConfigError(
        f"unknown option {key!r} for {what}{did_you_mean(key, valid, quote=True)}; "
        f"valid options: {', '.join(sorted(valid)) or '(none)'}"
    )


def _describe(obj: object) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__name__)}"


def _same_definition(a: object, b: object) -> bool:
    """True for the same class or function defined again (a module imported a second time)."""
    return _describe(a) == _describe(b) and hasattr(a, "__qualname__")


class Registry(Generic[T]):
    """Names -> entries of one kind (e.g. "primitive").

    Args:
        kind: what the entries are, for messages ("unknown primitive 's5'").
        modules: modules that register the built-in entries, imported at the first lookup (so
            the registry is complete whichever module was imported first, without import cycles).
    """

    def __init__(self, kind: str, *, modules: Sequence[str] = ()):
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._modules = tuple(modules)
        self._modules_loaded = False

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {len(self._entries)} entries)"

    # ---- registering -----------------------------------------------------------------------

    def register(self, name: str, entry: T | None = None, *, replace: bool = False) -> Any:
        """Register ``entry`` under ``name``; without ``entry``, a decorator that registers what it decorates.

        A name registered for something else is an error unless ``replace``; defining the same
        class or function again (its module imported anew) replaces it.
        """
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"a {self.kind} name must be a non-empty string, got {name!r}")

        def add(obj: T) -> T:
            old = self._entries.get(name)
            if old is not None and old is not obj and not replace and not _same_definition(old, obj):
                raise ConfigError(
                    f"{self.kind} {name!r} is already registered ({_describe(old)}); "
                    f"cannot register {_describe(obj)} under the same name (pass replace=True to override it)"
                )
            self._entries[name] = obj
            return obj

        return add if entry is None else add(entry)

    def unregister(self, name: str) -> None:
        """Remove ``name`` (missing names are ignored)."""
        self._entries.pop(name, None)

    # ---- looking up ------------------------------------------------------------------------

    def _load(self) -> None:
        if not self._modules_loaded:
            self._modules_loaded = True
            for module in self._modules:
                importlib.import_module(module)
        load_plugins()

    def names(self) -> list[str]:
        """The registered names, sorted."""
        self._load()
        return sorted(self._entries)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._entries

    def get(self, name: str) -> T:
        """The entry of ``name``; an unknown name is a ConfigError that lists the known ones."""
        self._load()
        if name not in self._entries:
            known = self.names()
            raise ConfigError(
                f"unknown {self.kind} {name!r}{did_you_mean(name, known, quote=True)}; "
                f"known {self.kind}s: {', '.join(known) or '(none)'}; {PLUGIN_HINT}"
            )
        return self._entries[name]

    __getitem__ = get

    # ---- building --------------------------------------------------------------------------

    def options(self, name: str, n_args: int = 0) -> dict[str, Any]:
        """The keyword options of ``name``'s constructor (after ``n_args`` positional arguments),
        with their defaults (``inspect.Parameter.empty`` for required ones)."""
        return {p.name: p.default for p in _keywords(_signature(self.get(name), self.kind, name), n_args).values()}

    def build(self, name: str, /, *args: Any, **options: Any) -> Any:
        """``entry(*args, **options)``, after checking ``options`` against the entry's signature."""
        return self.build_from(name, args, options)

    def build_from(
        self,
        name: str,
        args: Sequence[Any] = (),
        options: Mapping[str, Any] | None = None,
        *,
        offered: Mapping[str, Any] | None = None,
        where: str = "",
    ) -> Any:
        """Build ``name`` with positional ``args`` and keyword ``options``.

        ``options`` must all be parameters of the entry (or it takes ``**kwargs``); ``offered`` are
        passed only to parameters the entry names explicitly and ``options`` do not set (settings
        from the model config that only some entries use). A required parameter left unset, or
        an unknown option, is a ConfigError naming it, raised before the entry is called: errors
        raised inside the constructor propagate as they are. ``where`` prefixes the messages
        (e.g. "model.primitive_options").
        """
        entry = self.get(name)
        kwargs = self.check(name, len(args), dict(options or {}), offered or {}, where=where)
        return entry(*args, **kwargs)

    def check(
        self,
        name: str,
        n_args: int,
        options: Mapping[str, Any],
        offered: Mapping[str, Any] | None = None,
        *,
        where: str = "",
    ) -> dict[str, Any]:
        """The keyword arguments :meth:`build_from` would pass (see there), or the ConfigError it would raise."""
        what = f"{self.kind} {name!r}"
        prefix = f"{where}: " if where else ""
        sig = _signature(self.get(name), self.kind, name)
        params = list(sig.parameters.values())
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if n_args > len(positional) and not any(p.kind is p.VAR_POSITIONAL for p in params):
            raise ConfigError(f"{prefix}{what} takes {len(positional)} positional argument(s), is built with {n_args}")
        by_position = {p.name for p in positional[:n_args]}
        keywords = _keywords(sig, n_args)
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params)
        for key in options:
            if key in by_position:
                raise ConfigError(f"{prefix}option {key!r} of {what} is set by the builder, not by options")
            if key not in keywords and not takes_any:
                raise ConfigError(prefix + str(unknown_option(key, what, list(keywords))))
        kwargs = {k: v for k, v in (offered or {}).items() if k in keywords and k not in options}
        kwargs.update(options)
        missing = [p.name for p in positional[n_args:] if p.kind is p.POSITIONAL_ONLY and p.default is p.empty]
        missing += [k for k, p in keywords.items() if p.default is p.empty and k not in kwargs]
        if missing:
            raise ConfigError(f"{prefix}{what} needs the option(s) {', '.join(missing)}")
        return kwargs

    def accepts(self, name: str, parameter: str, n_args: int = 0) -> bool:
        """Whether ``name``'s constructor names ``parameter`` (after ``n_args`` positional arguments)."""
        return parameter in _keywords(_signature(self.get(name), self.kind, name), n_args)


def _signature(entry: Callable[..., Any], kind: str, name: str) -> inspect.Signature:
    try:
        return inspect.signature(entry)
    except (TypeError, ValueError) as err:  # builtins without a signature
        raise ConfigError(f"{kind} {name!r} ({_describe(entry)}) has no readable signature: {err}") from None


def _keywords(sig: inspect.Signature, n_args: int) -> dict[str, inspect.Parameter]:
    """Parameters that can be given by keyword, less the first ``n_args`` positional ones."""
    params = list(sig.parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    taken = {p.name for p in positional[:n_args]}
    return {p.name: p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in taken}
