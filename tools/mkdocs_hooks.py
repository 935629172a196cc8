"""MkDocs hooks of the documentation site (``mkdocs.yml``: ``hooks``).

Three jobs, so that ``mkdocs build --strict`` checks what a reader would follow:

* **The home page is the README.** ``index.md`` is README.md with its ``docs/`` prefixes taken off
  its links: one front page, in the repository and on the site. A README link that leaves
  ``docs/`` fails the build (the README links only to docs/).
* **API pages.** ``api/<package>.md`` is generated for every package of :data:`API_PACKAGES`: the
  package's docstring, then every name of its ``__all__`` (the names its ``__init__`` exports,
  lazily or not) rendered from its docstring by mkdocstrings at the place it is defined. A name
  exported but not importable fails the build.
* **Links out of ``docs/``.** The pages link to scripts, raw results and plots of the repository
  (``../benchmarks/results/x.json``). Each such file is copied into the site under ``repo/`` and
  the link rewritten to the copy, so the site stands alone; a link to a file that does not exist
  is left as written, and MkDocs' own link check (strict) fails on it, naming the page.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
from pathlib import Path

from mkdocs.structure.files import File, Files

#: Packages with an API page, in the order of the layers (docs/architecture.md).
API_PACKAGES = (
    "ops",
    "layers",
    "blocks",
    "models",
    "data",
    "objectives",
    "train",
    "experiment",
    "report",
    "bench",
    "studies",
)
#: Where the copies of the repository's files go inside the site.
REPO_DIR = "repo"

_LINK = re.compile(r"(?P<head>!?\[[^\]\n]*\]\()(?P<target>[^)\s#]+)(?P<tail>(?:#[^)\s]*)?\))")


def _absolute(path) -> Path:
    """``path`` made absolute without following links (a linked folder stays where the link is)."""
    return Path(os.path.abspath(path))


def _root(config) -> Path:
    return _absolute(config["config_file_path"]).parent


def _docs(config) -> Path:
    return _absolute(config["docs_dir"])


def _outside_targets(page: Path, text: str, docs: Path, root: Path):
    """(link target as written, repository path) of every relative link of ``page`` that leaves docs/."""
    for match in _LINK.finditer(_without_code(text)):
        target = match["target"]
        if "://" in target or target.startswith(("/", "mailto:")):
            continue
        path = _absolute(page.parent / target)
        if path.is_relative_to(docs) or not path.is_relative_to(root):
            continue
        yield target, path.relative_to(root)


_FENCED = re.compile(r"(^(?:`{3,}|~{3,}).*?^(?:`{3,}|~{3,})\s*$)", re.M | re.S)


def _outside_code(text: str, change) -> str:
    """``text`` with ``change`` applied to what lies outside its fenced blocks (a link shown in a code
    block is not a link), the blocks kept as they are."""
    parts = _FENCED.split(text)
    return "".join(part if i % 2 else change(part) for i, part in enumerate(parts))


def _without_code(text: str) -> str:
    """``text`` with its fenced blocks blanked."""
    return "".join(part for i, part in enumerate(_FENCED.split(text)) if not i % 2)


def api_page(package: str) -> str:
    """The Markdown of ``api/<package>.md``: the package's docstring, then each exported name."""
    module = importlib.import_module(f"longrange.{package}")
    names = list(getattr(module, "__all__", ()))
    lines = [f"# `longrange.{package}`", "", f"::: longrange.{package}", "    options:", "      members: false", ""]
    rows = []
    for name in names:
        obj = getattr(module, name)  # an export that does not import fails the build here
        target = inspect.unwrap(obj) if callable(obj) else obj
        if inspect.isclass(target) or inspect.isfunction(target):
            path = f"{target.__module__}.{target.__qualname__}"
            lines += [f"::: {path}", "    options:", "      heading_level: 2", ""]
        else:
            rows.append(f"| `{name}` | `{type(obj).__module__}.{type(obj).__qualname__}` |")
    if rows:
        lines += ["## Objects", "", "| name | type |", "|---|---|", *rows, ""]
    return "\n".join(lines)


def home_page(root: Path) -> str:
    """README.md as the site's ``index.md``: its links made relative to ``docs/``."""
    text = (root / "README.md").read_text(encoding="utf-8")
    for match in _LINK.finditer(_without_code(text)):
        target = match["target"]
        if "://" not in target and not target.startswith(("docs/", "mailto:")):
            raise ValueError(f"README.md links to {target!r}, outside docs/: the site's home page cannot follow it")
    return _outside_code(text, lambda part: re.sub(r"(!?\[[^\]\n]*\]\()docs/", r"\1", part))


def on_files(files: Files, config) -> Files:
    docs, root = _docs(config), _root(config)
    files.append(File.generated(config, "index.md", content=home_page(root)))
    for package in API_PACKAGES:
        files.append(File.generated(config, f"api/{package}.md", content=api_page(package)))
    copied = set()
    for page in sorted(docs.rglob("*.md")):
        for _, path in _outside_targets(page, page.read_text(encoding="utf-8"), docs, root):
            if path in copied or not (root / path).is_file():
                continue
            copied.add(path)
            uri = f"{REPO_DIR}/{path.as_posix()}"
            if uri.endswith(".md"):  # shown as the file it is, not rendered as a page of the site
                uri += ".txt"
            files.append(File.generated(config, uri, abs_src_path=str(root / path)))
    return files


_ROLE = re.compile(r":(?:func|class|mod|meth|attr|data|exc|obj):(?=<code>)")


def on_page_content(html: str, page, config, files: Files) -> str:
    """Docstrings name objects with reST roles (``:func:`x```); the site shows the name alone."""
    return _ROLE.sub("", html)


def on_page_markdown(markdown: str, page, config, files: Files) -> str:
    docs, root = _docs(config), _root(config)
    source = Path(page.file.abs_src_path) if page.file.abs_src_path else None
    if source is None or not source.is_relative_to(docs):
        return markdown
    rewrites = {}
    for target, path in _outside_targets(source, markdown, docs, root):
        uri = f"{REPO_DIR}/{path.as_posix()}" + (".txt" if path.suffix == ".md" else "")
        if files.get_file_from_path(uri) is not None:
            rewrites[target] = os.path.relpath(docs / uri, source.parent).replace(os.sep, "/")

    def replace(match: re.Match) -> str:
        new = rewrites.get(match["target"])
        return match.group(0) if new is None else f"{match['head']}{new}{match['tail']}"

    return _outside_code(markdown, lambda part: _LINK.sub(replace, part))
