"""Every code block of README.md and docs/*.md runs as written: an example that breaks fails the tests.

How the blocks are read (``tests/docs_examples.py``):

* Every fenced block needs a language. ```` ```bash ````, ``sh``, ``shell`` and ``console`` blocks run
  (a ``console`` block's commands are its lines after a ``$ `` prompt; its other lines are output);
  ```` ```python ```` blocks run as scripts; ```` ```yaml ```` and ``json`` blocks are parsed, and a
  YAML block whose top-level keys are sections of an experiment (``task``, ``model``, ``train``,
  ``compare``, ...) is checked by the config loader. A Python or YAML block whose first line is a
  comment naming a file (``# mymodels/recent_sum.py``) is also written to that file, for the
  commands after it.
* **Output is never run**: blocks of program output, tables and figures are ```` ```text ````
  (or ``output``). A block without a language, or in a language not listed above, fails the
  test ``test_every_block_is_read`` naming its file and line, so that no command escapes by
  accident.
* A block that must not run says so in the Markdown, in an HTML comment right above it (invisible
  when rendered), with its reason: ``<!-- docs-test: skip (needs a GPU) -->`` skips the block,
  ``<!-- docs-test: skip "pip install" (reinstalls the package) -->`` the block's commands that
  contain that text; the test is reported as skipped with that reason. ``<!-- docs-test: slow
  (reason) -->`` runs the block only with ``-m slow``; ``<!-- docs-test: fails (reason) -->`` marks a
  block that shows an error: each of its commands must exit non-zero, and a ``console`` block's
  shown output must be in what the command printed (line breaks and numbers aside), so an error
  message that changes fails too; ``env NAME=VALUE``, ``timeout SECONDS`` and ``setup `COMMAND`
  (reason)`` (a command run once before, for a page that uses what another page made) are the other
  directives.

How they run: each file's blocks run in order, in one temporary working directory of their own
(a copy of the repository's ``docs/`` and ``benchmarks/``, and ``data/`` with stand-in data sets in
the published layouts of ListOps, CIFAR-10 and IMDb), so that a ``report`` reads what a
``compare`` before it wrote; exported variables and the directory carry over from one shell block
to the next, as in one terminal. Every block runs with ``LONGRANGE_SMOKE=1`` (``longrange.smoke``:
a few steps of small batches, two seeds, short evaluation splits, small generated data: the
commands unchanged, the work shrunk to seconds) and ``WANDB_MODE=offline``, under a timeout (5
minutes, an hour for a slow block, or the block's ``timeout`` directive). The
``longrange`` commands and the Python blocks run in processes forked from one that has imported
longrange (``docs_examples.Server``), which saves the seconds of importing torch per command
(slow blocks run the installed ``longrange`` and Python).
Each block is a test named by its file and line; running a block alone (``-k 'README.md:10'``)
first runs the blocks of its file before it.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path

import docs_examples as D
import pytest


def _read_all() -> tuple[list[D.Block], dict[str, str]]:
    blocks, errors = [], {}
    for path in D.doc_files():
        rel = path.relative_to(D.ROOT).as_posix()
        try:
            blocks += D.collect(path)
        except D.DocsError as err:
            errors[rel] = str(err)
    return blocks, errors


BLOCKS, READ_ERRORS = _read_all()


def _params() -> list:
    params = []
    for block in BLOCKS:
        if not block.runs:
            continue
        marks = []
        if block.skip_reason:
            marks.append(pytest.mark.skip(reason=f"{block.id}: {block.skip_reason}"))
        elif block.slow_reason:
            marks.append(pytest.mark.slow)
        params.append(pytest.param(block, None, marks=marks, id=block.id))
        if block.skip_reason:
            continue
        for command, reason in block.skipped_commands():
            params.append(
                pytest.param(
                    block,
                    command,
                    id=f"{block.path}:{command.line}",
                    marks=pytest.mark.skip(reason=f"{block.path}:{command.line} `{command.text}`: {reason}"),
                )
            )
    return params


@pytest.mark.parametrize("path", [p.relative_to(D.ROOT).as_posix() for p in D.doc_files()])
def test_every_block_is_read(path):
    """Each file's blocks have a known language and its directives stand right above a block."""
    assert path not in READ_ERRORS, READ_ERRORS[path]


# ---------------------------------------------------------------------------------------------------
# Running the blocks
# ---------------------------------------------------------------------------------------------------
#: Variables of the caller that would change what a block does; the blocks get their own.
CLEARED = ("LONGRANGE_", "WANDB_")


class Pages:
    """The pages of this session, each with its working directory, and the server they share."""

    def __init__(self, root: Path):
        self.root = root
        self.data = D.write_standin_data(root / "standin-data")
        env = {k: v for k, v in os.environ.items() if not k.startswith(CLEARED)}
        env.update({D.SMOKE_ENV: "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true", "MPLBACKEND": "Agg"})
        self.server = D.Server(root / "server")
        (root / "server").mkdir()
        self.python, self.server_bin = sys.executable, None
        if self.server.start(dict(env)):
            self.server_bin = str(self.server.bin)
            env["PATH"] = f"{self.server_bin}{os.pathsep}{env.get('PATH', '')}"
            self.python = str(self.server.bin / D.PYTHON_SHIM)
        self.env = env
        self.pages: dict[str, D.Page] = {}

    def page(self, path: str) -> D.Page:
        if path not in self.pages:
            page = D.Page(
                path,
                self.root / "pages" / path.replace("/", "_").replace(".md", ""),
                dict(self.env),
                python=self.python,
                server_bin=self.server_bin,
            )
            page.prepare(self.data)
            self.pages[path] = page
        return self.pages[path]


@pytest.fixture(scope="session")
def pages(tmp_path_factory):
    found = Pages(tmp_path_factory.mktemp("docs"))
    yield found
    found.server.stop()


def _failure(block: D.Block, outcome: D.Outcome, what: str = "") -> str:
    where = f"{block.path}:{outcome.line}" if outcome.line else block.id
    if outcome.timed_out:
        head = f"{where}: {what}timed out after {block.timeout} s"
    else:
        head = f"{where}: {what}exited with status {outcome.status}"
    return f"{head}\n{D.tail(outcome.output)}"


def _run(page: D.Page, block: D.Block) -> D.Outcome:
    skipped = {c.lines[0] for c, _ in block.skipped_commands()}
    page.done.add(block.id)
    return page.run(block, skipped, direct=bool(block.slow_reason))


@pytest.mark.parametrize("block, command", _params())
def test_docs_example(block, command, pages):
    page = pages.page(block.path)
    for earlier in BLOCKS:  # what this block builds on: the blocks of its file before it
        if earlier is block:
            break
        if (
            earlier.path == block.path
            and earlier.runs
            and earlier.id not in page.done
            and not earlier.skip_reason
            and not earlier.slow_reason
        ):
            outcome = _run(page, earlier)
            if outcome.status:
                pytest.fail(_failure(earlier, outcome, f"(an earlier block of {block.path}) "))
    outcome = _run(page, block)
    if outcome.status:
        pytest.fail(_failure(block, outcome))


# ---------------------------------------------------------------------------------------------------
# The collector itself
# ---------------------------------------------------------------------------------------------------
def test_the_commands_of_a_shell_block():
    text = "# a comment\nlongrange train --preset p \\\n    --out runs/x   # trailing comment\n\nRUN=runs/x\n"
    commands = D.shell_commands(text, first_line=10)
    assert [(c.line, c.text, c.lines) for c in commands] == [
        (11, "longrange train --preset p --out runs/x   # trailing comment", (1, 2)),
        (14, "RUN=runs/x", (4,)),
    ]
    console = "$ longrange evaluate runs/tiny \\\n    --memory-budget 10KiB\nerror: too small\n$ echo done\n"
    assert [(c.line, c.text) for c in D.shell_commands(console, 1, console=True)] == [
        (1, "longrange evaluate runs/tiny --memory-budget 10KiB"),
        (4, "echo done"),
    ]


PAGE = """# A page

<!-- docs-test: skip "pip install" (reinstalls the package) -->
```bash
pip install -e .
longrange demo
```

```text
output, never run
```

- a list item with a file:

  ```yaml
  # configs/wide.yaml
  model: {d_model: 128}
  ```

<!-- docs-test: slow (an hour) -->

<!-- docs-test: env A=1 B=two -->
<!-- docs-test: timeout 7 -->
```python
print("hello")
```

Prose may quote a directive, `<!-- docs-test: skip (a reason) -->`, without it applying.
"""


def test_a_page_is_read_into_blocks_with_their_directives(tmp_path):
    (tmp_path / "page.md").write_text(PAGE)
    blocks = D.collect(tmp_path / "page.md", root=tmp_path)
    assert [(b.id, b.lang, b.runs) for b in blocks] == [
        ("page.md:4", "bash", True),
        ("page.md:9", "text", False),
        ("page.md:15", "yaml", True),
        ("page.md:24", "python", True),
    ]
    bash, _, yaml_block, python = blocks
    assert bash.skip_reason is None and [(c.text, r) for c, r in bash.skipped_commands()] == [
        ("pip install -e .", "reinstalls the package")
    ]
    assert yaml_block.text == "# configs/wide.yaml\nmodel: {d_model: 128}\n"  # the list's indentation removed
    assert yaml_block.file_name == "configs/wide.yaml" and python.file_name is None
    assert python.slow_reason == "an hour" and python.env == {"A": "1", "B": "two"} and python.timeout == 7
    assert (
        bash.timeout == D.DEFAULT_TIMEOUT
        and dataclasses.replace(python, directives=python.directives[:1]).timeout == D.SLOW_TIMEOUT
    )
    script = D.shell_script(bash, {c.lines[0] for c, _ in bash.skipped_commands()})
    assert script.splitlines() == [":  # skipped", "longrange demo"]


@pytest.mark.parametrize(
    "text, message",
    [
        ("```\nlongrange demo\n```\n", r"page.md:1: a code block without a language; write ```text"),
        ("```ini\n[a]\n```\n", r"page.md:1: code blocks in 'ini' are not known"),
        (
            "<!-- docs-test: skip (why) -->\nsome text\n```bash\nls\n```\n",
            r"page.md:1: a docs-test directive must be right above",
        ),
        ("text\n<!-- docs-test: skip (why) -->\n", r"page.md:2: a docs-test directive must be right above"),
        (
            "<!-- docs-test: skip -->\n```bash\nls\n```\n",
            r"page.md:1: a docs-test skip needs its reason in parentheses",
        ),
        ("<!-- docs-test: slow -->\n```bash\nls\n```\n", r"page.md:1: a docs-test slow needs its reason"),
        ('<!-- docs-test: skip "pip" (why) -->\n```bash\nls\n```\n', r"page.md:1: skip 'pip' matches no command"),
        (
            "<!-- docs-test: skip (why) -->\n```text\nout\n```\n",
            r"page.md:2: a docs-test directive above a ```text block",
        ),
        (
            "<!-- docs-test: sometimes (why) -->\n```bash\nls\n```\n",
            r"page.md:1: unknown docs-test directive 'sometimes'",
        ),
        ("<!-- docs-test: timeout soon -->\n```bash\nls\n```\n", r"page.md:1: docs-test timeout takes a number"),
        ("<!-- docs-test: env A -->\n```bash\nls\n```\n", r"page.md:1: docs-test env takes NAME=VALUE"),
        (
            "<!-- docs-test: setup longrange demo -->\n```bash\nls\n```\n",
            r"page.md:1: docs-test setup takes one command",
        ),
        (
            "text <!-- docs-test: skip (why) -->, `<!-- docs-test: quoted -->`\n",
            r"page.md:1: a docs-test comment must stand alone",
        ),
        ("```console\nonly output\n```\n", r"page.md:1: a console block without a `\$ ` command"),
        ("```bash\nls\n", r"page.md:1: the code block is never closed"),
        ("<!-- docs-test: fails -->\n```bash\nls\n```\n", r"page.md:1: docs-test fails takes only its reason"),
        ("<!-- docs-test: fails (why) -->\n```python\n1\n```\n", r"page.md:2: docs-test fails is for shell blocks"),
    ],
)
def test_a_page_that_cannot_be_read_is_an_error_naming_the_line(tmp_path, text, message):
    (tmp_path / "page.md").write_text(text)
    with pytest.raises(D.DocsError, match=message):
        D.collect(tmp_path / "page.md", root=tmp_path)


def _page(tmp_path, text, pages=None):
    (tmp_path / "page.md").write_text(text)
    work = tmp_path / "work"
    work.mkdir()
    env = pages.env if pages else {k: v for k, v in os.environ.items() if not k.startswith(CLEARED)}
    page = D.Page("page.md", work, dict(env), python=pages.python if pages else sys.executable)
    return D.collect(tmp_path / "page.md", root=tmp_path), page


def test_shell_blocks_share_variables_and_directory_and_a_failure_names_its_line(tmp_path):
    blocks, page = _page(
        tmp_path,
        "```bash\nexport A=1\nmkdir sub && cd sub\n```\n\n"
        '```bash\ntest "$A" = 1\ntest "$(basename "$PWD")" = sub\nfalse\necho after\n```\n',
    )
    first = page.run(blocks[0])
    assert first.status == 0 and page.cwd == tmp_path / "work" / "sub" and page.env["A"] == "1"
    second = page.run(blocks[1])
    assert (second.status, second.line) == (1, 9) and "after" not in second.output  # line 9: `false`


def test_a_block_that_shows_an_error_must_fail_as_shown(tmp_path):
    """``fails``: each command must exit non-zero, and a console block's output must be what it printed
    (its line breaks and numbers aside)."""
    error = (
        "import sys; print('error: needs about 23.5 KiB per sequence of length 32, more than the budget'); sys.exit(1)"
    )
    blocks, page = _page(
        tmp_path,
        (
            "<!-- docs-test: fails (a budget too small) -->\n```console\n"
            f'$ python -c "{error}"\nerror: needs about 7.1 KiB per sequence of\nlength 128, more than the budget\n```\n\n'
            "<!-- docs-test: fails (a budget too small) -->\n```console\n"
            f'$ python -c "{error}"\nerror: needs about 7.1 KiB per token\n```\n\n'
            "<!-- docs-test: fails (a missing file) -->\n```bash\nls no-such-file\ntrue\necho after\n```\n"
        ),
    )
    assert blocks[0].shown_outputs() == ["error: needs about 7.1 KiB per sequence of\nlength 128, more than the budget"]
    assert page.run(blocks[0]).status == 0  # failed, and said what the page shows
    other = page.run(blocks[1])
    assert other.status == 1 and "shows an output that the command did not print" in other.output
    succeeded = page.run(blocks[2])  # `true` succeeds: the block fails there
    assert (succeeded.status, succeeded.line) == (
        1,
        17,
    ) and "succeeded, but the page shows it failing: true" in succeeded.output
    assert "after" not in succeeded.output


def test_a_block_past_its_timeout_is_stopped(tmp_path):
    blocks, page = _page(tmp_path, "<!-- docs-test: timeout 1 -->\n```bash\nsleep 60\n```\n")
    outcome = page.run(blocks[0])
    assert outcome.timed_out and outcome.status == 124


def test_python_and_yaml_blocks(tmp_path, pages):
    blocks, page = _page(
        tmp_path,
        "```python\n# tool.py\nimport sys\nprint('ran', sys.argv[0])\n```\n\n"
        "```yaml\n# my.yaml\ntrain: {lr: 0.01}\n```\n\n"
        "```yaml\ntrain: {lr: -1}\n```\n\n"
        "```yaml\nnot: [an, experiment]\n```\n",
        pages,
    )
    ran = page.run(blocks[0])
    assert ran.status == 0 and "ran tool.py" in ran.output and (page.workdir / "tool.py").is_file()
    assert (
        page.run(blocks[1]).status == 0 and (page.workdir / "my.yaml").read_text() == "# my.yaml\ntrain: {lr: 0.01}\n"
    )
    bad = page.run(blocks[2])
    assert bad.status == 1 and "train.lr must be a positive number" in bad.output
    assert page.run(blocks[3]).status == 0


def test_the_server_runs_commands_as_the_installed_ones_do(pages, tmp_path):
    if pages.python == sys.executable:
        pytest.skip("the docs-test server did not start here")
    env, longrange = pages.env, str(pages.server.bin / "longrange")
    version = D.run_process([longrange, "--version"], tmp_path, env, 60)
    assert version.status == 0 and version.output.startswith("longrange ")
    assert D.run_process([longrange, "no-such-command"], tmp_path, env, 60).status == 2
    error = D.run_process([longrange, "train", "--preset", "no/such", "--out", "x"], tmp_path, env, 60)
    assert error.status == 1 and "unknown preset 'no/such'" in error.output
    script = "import os, sys; print(os.getcwd(), sys.argv[1:]); sys.exit(3)"
    ran = D.run_process([pages.python, "-c", script, "x"], tmp_path, env, 60)
    assert (ran.status, ran.output.strip()) == (3, f"{tmp_path} ['x']")
    # a command past its timeout is killed with what it started: the forked process too
    sleeper = "import os, time; open('pid', 'w').write(str(os.getpid())); time.sleep(60)"
    assert D.run_process([pages.python, "-c", sleeper], tmp_path, env, 3).timed_out
    pid = int((tmp_path / "pid").read_text())
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the forked process {pid} outlived its timeout")
