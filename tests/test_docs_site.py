"""The documentation site builds in strict mode: a broken link, an anchor that is not there, a page
left out of the navigation or an API export that does not import fails the suite (and so CI).

The hooks (``tools/mkdocs_hooks.py``) are tested on their own too: the README as the home page,
links out of ``docs/`` copied into the site, one API page per package.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import mkdocs_hooks  # noqa: E402

sys.path.remove(str(ROOT / "tools"))


def build(root: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(root / "mkdocs.yml"), "-d", str(site)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def copy_of_the_repository(tmp_path: Path) -> Path:
    """What the site is built from, in a folder whose name has a space: docs/ and the config copied."""
    root = tmp_path / "a repo"
    root.mkdir()
    shutil.copytree(ROOT / "docs", root / "docs")
    for name in ("mkdocs.yml", "README.md"):
        shutil.copy(ROOT / name, root / name)
    for name in ("tools", "src", "benchmarks"):
        (root / name).symlink_to(ROOT / name, target_is_directory=True)
    return root


def test_the_site_builds_in_strict_mode(tmp_path):
    result = build(ROOT, tmp_path / "site")
    assert result.returncode == 0, result.stderr[-4000:]
    site = tmp_path / "site"
    home = (site / "index.html").read_text()
    assert "longrange demo" in home and 'href="install/"' in home  # the README, its docs/ links made the site's
    for package in mkdocs_hooks.API_PACKAGES:
        assert (site / "api" / package / "index.html").is_file()
    ops = (site / "api" / "ops" / "index.html").read_text()
    assert 'id="longrange.ops.scan.dispatch.selective_scan"' in ops and ":func:" not in ops
    # a script linked from a page is in the site, and the page's link leads to it
    assert (site / "repo" / "benchmarks" / "recall_spt.py").is_file()
    assert "repo/benchmarks/recall_spt.py" in (site / "small-scale-spt" / "index.html").read_text()


def test_broken_links_and_a_page_left_out_fail_the_build_each_named(tmp_path):
    """One build of a damaged copy: every fault is reported (strict mode stops after reading all pages)."""
    root = copy_of_the_repository(tmp_path)
    page = root / "docs" / "testing.md"
    links = {
        "[a page](no-such-page.md)": "no-such-page.md",
        "[an anchor](models.md#no-such-section)": "#no-such-section",
        "[a script](../benchmarks/no_such_script.py)": "../benchmarks/no_such_script.py",
    }
    page.write_text(page.read_text() + "\nSee " + ", ".join(links) + ".\n")
    (root / "docs" / "orphan.md").write_text("# An orphan\n")
    result = build(root, tmp_path / "site")
    assert result.returncode != 0
    warnings = [line for line in result.stderr.splitlines() if line.startswith("WARNING")]
    for message in links.values():
        assert any("testing.md" in line and message in line for line in warnings), (message, warnings)
    assert 'not included in the "nav"' in result.stderr and "- orphan.md" in result.stderr
    assert len(warnings) == 4, warnings  # the intact pages warn of nothing


def test_the_home_page_is_the_readme_with_its_links_made_the_sites(tmp_path):
    (tmp_path / "README.md").write_text(
        "# x\n\n[Install](docs/install.md), ![a plot](docs/img/a.png), [web](https://example.org)\n"
        "```bash\necho '[not a link](elsewhere.md)'\n```\n"
    )
    page = mkdocs_hooks.home_page(tmp_path)
    assert "[Install](install.md)" in page and "![a plot](img/a.png)" in page and "(https://example.org)" in page
    (tmp_path / "README.md").write_text("# x\n\n[a script](benchmarks/run.py)\n")
    with pytest.raises(ValueError, match="benchmarks/run.py"):
        mkdocs_hooks.home_page(tmp_path)


def test_links_out_of_docs_are_found_outside_code_blocks_only(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    text = (
        "[in docs](other.md) [out](../benchmarks/x.py#L3) [web](https://example.org/a.py)\n"
        "```bash\ncat [shown](../src/y.py)\n```\n![plot](../benchmarks/results/p.png)\n"
    )
    found = list(mkdocs_hooks._outside_targets(docs / "page.md", text, docs, tmp_path))
    assert found == [
        ("../benchmarks/x.py", Path("benchmarks/x.py")),
        ("../benchmarks/results/p.png", Path("benchmarks/results/p.png")),
    ]


def test_each_api_page_names_every_export_of_its_package():
    import importlib

    for package in mkdocs_hooks.API_PACKAGES:
        module = importlib.import_module(f"longrange.{package}")
        page = mkdocs_hooks.api_page(package)
        for name in getattr(module, "__all__", ()):
            assert f".{name}\n" in page or f"| `{name}` |" in page, (package, name)
