"""Fidelity of the presets to the published configurations they reproduce.

``presets/_fidelity.yaml`` lists, for every preset, each published field: the value the source
gives, where it is published (file and line, or paper section), and our value with the reason
where ours differs. ``tests/experiment/test_fidelity.py`` resolves every preset and checks each
listed field against it. From the same file this module renders

* :func:`differences_page`: ``docs/fidelity.md``, the differences only, grouped by preset family
  (the first part of a preset's name): a header per family, each preset with what it reproduces
  and how many of its published fields are the same, and each distinct difference once with the
  presets it applies to;
* :func:`preset_listing`: one preset's every published field, the same ones included (``longrange
  presets --fidelity NAME``).

File format::

    sources: {ABBREVIATION: what it stands for}
    shared: {NAME: [entry, ...]}               # entry lists included by several presets
    presets:
      NAME:
        row: the published row (table, task), or null for presets that reproduce no row
        note: optional text
        include: [shared NAME, ...]
        fields: [entry, ...]                   # a field given here replaces an included one

    entry: {field: dotted.path, published: VALUE, as: "how the source writes it",
            ours: VALUE (only where it differs), at: "SOURCE file:line", why: "reason for ours"}
           or, for what no config field expresses, {name: text, published: text, ours: text, at, why}

An entry *differs* when it gives ``ours``: a field whose value is not the published one, or a
named setting (which always says in words what we do, and why) whose reason does not begin with
"same".
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

import yaml

from longrange.errors import ConfigError

#: The command that regenerates ``docs/fidelity.md``.
WRITE_COMMAND = "PYTHONPATH=src python tests/experiment/test_fidelity.py --write"

#: What a family of presets is when its presets cite no paper.
PRESET_FAMILIES = {
    "demo": "the settings of `longrange demo`: demo/recall/* (the default, and the recall study's "
    "other models) and the ListOps demo"
}

_COLUMNS = ("field", "published", "where", "ours")


def fidelity_file():
    """The packaged ``presets/_fidelity.yaml``."""
    return resources.files("longrange") / "presets" / "_fidelity.yaml"


def load_fidelity() -> dict[str, Any]:
    """The contents of ``presets/_fidelity.yaml``: ``sources``, ``shared`` and ``presets``."""
    data = yaml.safe_load(fidelity_file().read_text())
    if not isinstance(data, dict) or set(data) != {"sources", "shared", "presets"}:
        keys = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise ConfigError(
            f"presets/_fidelity.yaml must have the top-level keys presets, shared and sources, got {keys}"
        )
    return data


def entry_key(entry: Mapping[str, Any]) -> str:
    """An entry's dotted field, or its name where no config field expresses it."""
    return entry.get("field") or entry["name"]


def expand(data: Mapping[str, Any], name: str) -> list[dict[str, Any]]:
    """The entries of a preset: its includes in order, then its own fields (replacing same keys)."""
    spec = data["presets"][name]
    out: dict[str, dict[str, Any]] = {}
    for shared in spec.get("include") or []:
        if shared not in data["shared"]:
            raise ConfigError(f"presets/_fidelity.yaml: {name} includes an unknown shared list {shared!r}")
        for entry in data["shared"][shared]:
            out[entry_key(entry)] = entry
    for entry in spec.get("fields") or []:
        out[entry_key(entry)] = entry
    return list(out.values())


def same(a: Any, b: Any) -> bool:
    """Whether two values from YAML are the same setting (numbers to a relative 1e-9, booleans
    only equal to booleans, lists and mappings item by item)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def differs(entry: Mapping[str, Any]) -> bool:
    """Whether ours differs from the published value: a field whose ``ours`` is not the published
    value, or a named setting whose reason does not begin with "same" (a named setting says in
    words what we do; "same (our DLR default)" says that it is what the source does)."""
    if "ours" not in entry:
        return False
    if "name" in entry:
        return str(entry.get("why", "")).split(" ", 1)[0].rstrip(":,;") != "same"
    return not same(entry["ours"], entry["published"])


def status(entry: Mapping[str, Any]) -> str:
    """The last column of a preset's full table: "same", or the reason ours is what it is."""
    given = "ours" in entry and ("name" in entry or not same(entry["ours"], entry["published"]))
    return entry["why"] if given else "same"


def format_value(value: Any) -> str:
    """A value as the page writes it (YAML-like: ``true``, ``null``, ``[a, b]``, ``1e-05``)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {format_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def entry_cells(entry: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """(field, published, where, ours) of an entry as table cells (unescaped)."""
    field = f"`{entry['field']}`" if "field" in entry else entry["name"]
    published = format_value(entry["published"]) + (f" ({entry['as']})" if entry.get("as") else "")
    ours = format_value(entry["ours"] if "ours" in entry else entry["published"])
    return field, published, entry["at"], ours


def _reproduces(spec: Mapping[str, Any]) -> str:
    return f"Reproduces: {spec['row']}." if spec["row"] else "Reproduces no published row."


def _counted(n: int, thing: str) -> str:
    return f"{n:,} {thing}{'' if n == 1 else 's'}"


# ------------------------------------------------------------------ one preset, every field
def _check_preset(data: Mapping[str, Any], name: str) -> None:
    if name in data["presets"]:
        return
    from longrange.experiment.config import load_preset

    load_preset(name)  # an unknown preset: the usual error, with the closest names
    raise ConfigError(f"preset {name!r} has no entry in presets/_fidelity.yaml")


def preset_section(data: Mapping[str, Any], name: str) -> list[str]:
    """A preset's heading, what it reproduces, its note and the table of every published field
    (ours, and "same" or the reason for the difference)."""
    spec = data["presets"][name]
    lines = [f"### `{name}`", "", _reproduces(spec)]
    if spec.get("note"):
        lines += ["", spec["note"].strip()]
    entries = expand(data, name)
    if entries:
        lines += ["", "| field | published | where | ours | |", "|---|---|---|---|---|"]
        for entry in entries:
            lines.append(_row((*entry_cells(entry), status(entry))))
    return lines


def preset_listing(name: str, data: Mapping[str, Any] | None = None) -> str:
    """``longrange presets --fidelity NAME``: the preset's every published field (same or
    different), how many are the same, and the sources its table cites."""
    data = load_fidelity() if data is None else data
    _check_preset(data, name)
    entries = expand(data, name)
    lines = preset_section(data, name)
    if entries:
        n_diff = sum(differs(e) for e in entries)
        counts = (
            f"{_counted(len(entries), 'published field')}: {len(entries) - n_diff:,} the same, "
            f"{n_diff:,} differ{'s' if n_diff == 1 else ''}."
        )
        lines += ["", counts]
        cited = _cited_sources(data, entries)
        lines += ["", "Sources:", ""] + [f"- **{key}**: {data['sources'][key]}" for key in cited]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------- the differences page
def cited(source: str) -> tuple[str, str]:
    """(the paper, where in it) of a preset's ``source``: ``Authors, Title (venue)`` and ``Table 2``."""
    first = source.split(";")[0].strip()
    end = first.find(")")
    if end < 0:
        return first, ""
    return first[: end + 1], first[end + 1 :].strip(" ,")


def family_paper(family: str, sources: Sequence[str]) -> str:
    """The paper a family of presets comes from: the one its presets' ``source`` cite most (the
    first cited on a tie), else the family's entry in :data:`PRESET_FAMILIES` (else "")."""
    papers = Counter(cited(s)[0] for s in sources if s)
    return papers.most_common(1)[0][0] if papers else PRESET_FAMILIES.get(family, "")


def family_papers(names: Sequence[str]) -> dict[str, str]:
    """The paper of each family of the named presets (see :func:`family_paper`)."""
    from longrange.experiment.config import load_preset

    sources: dict[str, list[str]] = {}
    for name in names:
        sources.setdefault(name.split("/")[0], []).append(str(load_preset(name).get("source") or ""))
    return {family: family_paper(family, items) for family, items in sources.items()}


def _cited_sources(data: Mapping[str, Any], entries: Sequence[Mapping[str, Any]]) -> list[str]:
    """The source abbreviations an entry list cites, in the order of ``sources``."""
    used = {e["at"].split()[0] for e in entries}
    return [key for key in data["sources"] if key in used]


def compact_names(names: Sequence[str]) -> list[str]:
    """Preset names grouped by their folder: ``mamba/induction-heads/{h3, hyena}``, one per folder,
    in the order the folders first appear."""
    folders: dict[str, list[str]] = {}
    for name in names:
        folder, _, last = name.rpartition("/")
        folders.setdefault(folder, []).append(last)
    out = []
    for folder, lasts in folders.items():
        tail = lasts[0] if len(lasts) == 1 else "{" + ", ".join(lasts) + "}"
        out.append(f"{folder}/{tail}" if folder else tail)
    return out


def family_differences(data: Mapping[str, Any], names: Sequence[str]) -> list[tuple[dict[str, Any], list[str]]]:
    """The distinct differing entries of the named presets, each with the presets it applies to, in
    the order they first appear (presets in the given order, entries in each preset's order)."""
    found: dict[str, tuple[dict[str, Any], list[str]]] = {}
    for name in names:
        for entry in expand(data, name):
            if differs(entry):
                key = _row((*entry_cells(entry), entry["why"]))  # as the reader sees it
                found.setdefault(key, (entry, []))[1].append(name)
    return list(found.values())


def differences_page(data: Mapping[str, Any], papers: Mapping[str, str] | None = None) -> str:
    """``docs/fidelity.md``: the differences from the published configurations, by family.
    ``papers``: the paper of each family (default: :func:`family_papers` of the presets)."""
    names = sorted(data["presets"])
    papers = family_papers(names) if papers is None else papers
    families: dict[str, list[str]] = {}
    for name in names:
        families.setdefault(name.split("/")[0], []).append(name)
    entries = {name: expand(data, name) for name in names}
    n_fields = sum(len(e) for e in entries.values())
    n_diff = sum(differs(x) for e in entries.values() for x in e)
    lines = [
        "# Fidelity of the presets to the published configurations",
        "",
        "Generated from `src/longrange/presets/_fidelity.yaml` by",
        f"`{WRITE_COMMAND}`; do not edit by hand.",
        "This page lists where the presets differ from the published configurations: every field or",
        "setting whose value is not the source's, with the source's value, where it is published,",
        "ours and why. Per family (the first part of a preset's name): its presets, what each",
        "reproduces and how many of its published fields are the same, then each difference once",
        "with the presets it applies to. `longrange presets --fidelity NAME` lists every published",
        "field of a preset, the same ones included. `tests/experiment/test_fidelity.py` resolves",
        "every preset and checks each listed field, and fails for a preset without an entry. Where a",
        "paper and its code disagree the presets follow the code; both are named.",
        "",
        (
            f"In all: {_counted(len(names), 'preset')}, {_counted(n_fields, 'published field')}, "
            f"{n_fields - n_diff:,} the same and {n_diff:,} different."
        ),
        "",
        "Sources (the first word of each *where*):",
        "",
    ]
    lines += [f"- **{key}**: {text}" for key, text in data["sources"].items()]
    for family, members in sorted(families.items()):
        lines += ["", *_family_section(data, family, members, entries, papers.get(family, ""))]
    return "\n".join(lines).rstrip() + "\n"


def _family_section(
    data: Mapping[str, Any], family: str, members: list[str], entries: Mapping[str, list[dict[str, Any]]], paper: str
) -> list[str]:
    rows = [n for n in members if data["presets"][n]["row"]]
    fields = [e for n in members for e in entries[n]]
    n_diff = sum(differs(e) for e in fields)
    diffs = family_differences(data, members)
    cited_keys = _cited_sources(data, fields)
    reproduce = (
        "none of which reproduces"
        if not rows
        else "each reproducing"
        if len(rows) == len(members)
        else f"{len(rows):,} of which reproduce{'s' if len(rows) == 1 else ''}"
    )
    summary = f"{_counted(len(members), 'preset')}, {reproduce} a published row"
    if fields and not n_diff:
        summary += f": {_counted(len(fields), 'published field')}, all the same."
    elif fields:
        summary += (
            f": {_counted(len(fields), 'published field')}, {len(fields) - n_diff:,} the same and "
            f"{n_diff:,} different ({_counted(len(diffs), 'distinct difference')}, below)."
        )
    else:
        summary += "; their notes say what they are."
    if cited_keys:
        summary += " Sources cited: " + ", ".join(f"**{k}**" for k in cited_keys) + "."
    lines = [
        f"## `{family}/`" + (f": {paper}" if paper else ""),
        "",
        summary,
        "",
        f"### Presets of `{family}/`",
        "",
        "| preset | reproduces | fields the same | fields that differ |",
        "|---|---|---|---|",
    ]
    for name in members:
        spec = data["presets"][name]
        n = sum(differs(e) for e in entries[name])
        counts = (f"{len(entries[name]) - n:,}", f"{n:,}") if entries[name] else ("", "")
        lines.append(_row((f"`{name}`", spec["row"] or "no published row", *counts)))
    notes = [n for n in members if data["presets"][n].get("note")]
    if notes:
        lines += ["", "Notes:", ""]
        lines += [f"- `{n}`: {data['presets'][n]['note'].strip()}" for n in notes]
    if diffs:
        lines += [
            "",
            f"### Differences in `{family}/`",
            "",
            "| field | published | where | ours | why | presets |",
            "|---|---|---|---|---|---|",
        ]
        for entry, names in diffs:
            presets = "<br>".join(f"`{group}`" for group in compact_names(names))
            lines.append(_row((*entry_cells(entry), entry["why"]))[:-1] + f"| {presets} |")
    return lines
