"""The code blocks of README.md and docs/*.md, read and run as the reader would run them.

``tests/test_docs_examples.py`` turns every block into a test; this module does the work:

* :func:`collect` reads a Markdown file's fenced blocks with their ``<!-- docs-test: ... -->``
  directives (:class:`Block`, :class:`Directive`); a block without a language, with a language
  the collector does not know, or a directive that is not right above a block, is a
  :class:`DocsError` naming the file and line;
* :class:`Page` runs the blocks of one file in order in one working directory (a copy of the
  repository's ``docs/`` and ``benchmarks/`` and a ``data/`` directory of stand-in data sets):
  shell blocks through ``bash`` as one script (exported variables and the directory carry over to
  the next block, as in one terminal), Python blocks as scripts, YAML blocks parsed (and, when they
  are experiments or parts of one, checked by the config loader);
* :class:`Server` keeps one process that has imported ``longrange`` (and so torch) and forks it for
  every ``longrange`` command of a block and every Python block: a ``longrange`` script first on
  the block's ``PATH`` hands its arguments, environment, directory and standard streams to it, and
  the forked process runs ``longrange.cli.main`` (or the script) exactly as the installed command
  would, in a process of its own. Importing torch takes 3-5 s on a 2-core machine; forking takes
  milliseconds. Without the server (``start`` failed) the installed command runs, and so it does
  for slow blocks (``Page.run(direct=True)``), whose time matters less than that a benchmark which
  inspects its processes sees the real ones.

Run as ``python tests/docs_examples.py serve SOCKET``, this file is that server.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Languages whose blocks run, are parsed, or are shown only.
SHELL = ("bash", "sh", "shell", "console")
PYTHON = ("python", "py")
YAML = ("yaml", "yml")
JSON = ("json",)
OUTPUT = ("text", "output")
LANGUAGES = SHELL + PYTHON + YAML + JSON + OUTPUT

#: The environment variable of smoke mode (``longrange.smoke``), set for every block.
SMOKE_ENV = "LONGRANGE_SMOKE"
#: Seconds a block may run unless its ``timeout`` directive says otherwise (a slow block: SLOW_TIMEOUT).
DEFAULT_TIMEOUT = 300
SLOW_TIMEOUT = 3600

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[^\s`]*)\s*$")
_DIRECTIVE = re.compile(r"^\s*<!--\s*docs-test:(?P<body>.*?)-->\s*$")
_ANY_DIRECTIVE = re.compile(r"<!--\s*docs-test")
_REASON = re.compile(r"\((?P<reason>[^()]*(?:\([^()]*\)[^()]*)*)\)\s*$")


class DocsError(Exception):
    """A Markdown file that the collector cannot read as documented: the message names file and line."""


@dataclass(frozen=True)
class Directive:
    """One ``<!-- docs-test: KIND ... -->`` comment above a block.

    ``skip (reason)``: the block does not run; ``skip "TEXT" ... (reason)``: its commands that contain
    one of the texts do not; ``slow (reason)``: the block runs only with ``-m slow``; ``env NAME=VALUE
    ...``: variables set for the block (e.g. a plugin that a YAML block's check needs); ``timeout
    SECONDS``; ``setup `COMMAND` (reason)``: a command run once in the page's directory before the
    block (a page that uses what another page's command makes); ``fails (reason)``: the block shows
    an error, so each of its commands must exit with a non-zero status, and in a ``console`` block
    the output it shows must be in what the command printed (lines joined, numbers aside).
    """

    kind: str
    line: int
    reason: str = ""
    texts: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    seconds: int = 0
    command: str = ""


KINDS = ("skip", "slow", "env", "timeout", "setup", "fails")


def parse_directive(body: str, where: str, line: int) -> Directive:
    """A :class:`Directive` from the text after ``docs-test:``; a DocsError naming ``where`` if malformed."""
    body = body.strip()
    kind, _, rest = body.partition(" ")
    rest = rest.strip()
    if kind not in KINDS:
        raise DocsError(f"{where}: unknown docs-test directive {kind!r}; known: {', '.join(KINDS)}")
    reason = ""
    match = _REASON.search(rest)
    if match and kind in ("skip", "slow", "setup", "fails"):
        reason, rest = match.group("reason").strip(), rest[: match.start()].strip()
    if kind in ("skip", "slow"):
        if not reason:
            raise DocsError(
                f"{where}: a docs-test {kind} needs its reason in parentheses, e.g. "
                f"<!-- docs-test: {kind} (needs a GPU) -->"
            )
        texts = tuple(shlex.split(rest)) if rest else ()
        if kind == "slow" and texts:
            raise DocsError(f"{where}: docs-test slow applies to the whole block, not to commands")
        return Directive(kind, line, reason=reason, texts=texts)
    if kind == "fails":
        if not reason or rest:
            raise DocsError(
                f"{where}: docs-test fails takes only its reason in parentheses, e.g. "
                "<!-- docs-test: fails (the budget is too small) -->"
            )
        return Directive(kind, line, reason=reason)
    if kind == "env":
        pairs = []
        for word in shlex.split(rest):
            name, eq, value = word.partition("=")
            if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise DocsError(f"{where}: docs-test env takes NAME=VALUE words, got {word!r}")
            pairs.append((name, value))
        if not pairs:
            raise DocsError(f"{where}: docs-test env names no variable")
        return Directive(kind, line, env=tuple(pairs))
    if kind == "timeout":
        if not rest.isdigit() or int(rest) < 1:
            raise DocsError(f"{where}: docs-test timeout takes a number of seconds, got {rest!r}")
        return Directive(kind, line, seconds=int(rest))
    command = re.fullmatch(r"`([^`]+)`", rest)
    if not command:
        raise DocsError(f"{where}: docs-test setup takes one command in backticks, got {rest!r}")
    return Directive(kind, line, reason=reason, command=command.group(1))


@dataclass(frozen=True)
class Command:
    """One command of a shell block: its first line in the Markdown file and its text
    (continuation lines joined, a console prompt removed)."""

    line: int
    text: str
    lines: tuple[int, ...]  # the block's line indices (0-based) that it spans


@dataclass(frozen=True)
class Block:
    """A fenced code block: the file (relative to the repository), the line of its opening fence,
    its language, its text (the fence's indentation removed) and its directives."""

    path: str
    line: int
    lang: str
    text: str
    directives: tuple[Directive, ...] = ()

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.lang not in OUTPUT

    def first(self, kind: str) -> Directive | None:
        return next((d for d in self.directives if d.kind == kind), None)

    @property
    def skip_reason(self) -> str | None:
        """The reason the whole block is skipped, or None."""
        d = next((d for d in self.directives if d.kind == "skip" and not d.texts), None)
        return d.reason if d else None

    @property
    def slow_reason(self) -> str | None:
        d = self.first("slow")
        return d.reason if d else None

    @property
    def fails_reason(self) -> str | None:
        d = self.first("fails")
        return d.reason if d else None

    def shown_outputs(self) -> list[str]:
        """The output a ``console`` block shows after each of its commands (none shown: left out)."""
        commands = self.commands()
        spans = {i for c in commands for i in c.lines}
        starts = {c.lines[0]: k for k, c in enumerate(commands)}
        chunks: dict[int, list[str]] = {}
        current = None
        for i, line in enumerate(self.text.splitlines()):
            if i in starts:
                current = starts[i]
            elif i not in spans and current is not None and line.strip():
                chunks.setdefault(current, []).append(line)
        return ["\n".join(lines) for _, lines in sorted(chunks.items())]

    @property
    def timeout(self) -> int:
        d = self.first("timeout")
        return d.seconds if d else SLOW_TIMEOUT if self.slow_reason else DEFAULT_TIMEOUT

    @property
    def env(self) -> dict[str, str]:
        return {k: v for d in self.directives if d.kind == "env" for k, v in d.env}

    @property
    def file_name(self) -> str | None:
        """The file a Python or YAML block is, when its first line is a comment naming it (``# my.yaml``)."""
        first = self.text.splitlines()[0] if self.text else ""
        match = re.fullmatch(r"#\s*([\w./-]+\.(?:py|ya?ml))\s*", first)
        return match.group(1) if match and self.lang in PYTHON + YAML else None

    def commands(self) -> list[Command]:
        """The commands of a shell block (see :func:`shell_commands`)."""
        return shell_commands(self.text, self.line + 1, console=self.lang == "console")

    def skipped_commands(self) -> list[tuple[Command, str]]:
        """The commands that a ``skip "TEXT"`` directive names, with its reason."""
        out = []
        for command in self.commands() if self.lang in SHELL else []:
            for d in self.directives:
                if d.kind == "skip" and any(t in command.text for t in d.texts):
                    out.append((command, d.reason))
                    break
        return out


def shell_commands(text: str, first_line: int, console: bool = False) -> list[Command]:
    """The commands of a shell block, each with the Markdown line it starts on: a line ending in a
    backslash continues on the next; blank lines and comment lines are no commands; in a console
    block only lines after a ``$ `` prompt are commands (the others are output)."""
    lines = text.splitlines()
    out: list[Command] = []
    i = 0
    while i < len(lines):
        raw = lines[i]
        stripped = raw.strip()
        if console:
            if not stripped.startswith("$ "):
                i += 1
                continue
            stripped = stripped[2:].strip()
        if not stripped or stripped.startswith("#"):
            i += 1
            continue
        start, parts, span = i, [], []
        while True:
            span.append(i)
            if stripped.endswith("\\") and i + 1 < len(lines):
                parts.append(stripped[:-1].strip())
                i += 1
                stripped = lines[i].strip()
            else:
                parts.append(stripped)
                break
        out.append(Command(first_line + start, " ".join(p for p in parts if p), tuple(span)))
        i += 1
    return out


def collect(path: Path, root: Path = ROOT) -> list[Block]:
    """The fenced blocks of a Markdown file, in order, with the directives right above each (blank
    lines may separate them). A DocsError names the file and line of a block without a language or
    with an unknown one, of an unclosed fence, and of a directive that no block follows."""
    rel = path.relative_to(root).as_posix() if path.is_absolute() else str(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    pending: list[Directive] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        directive = _DIRECTIVE.match(line)
        if directive:
            pending.append(parse_directive(directive.group("body"), f"{rel}:{i + 1}", i + 1))
            i += 1
            continue
        if _ANY_DIRECTIVE.search(re.sub(r"`[^`]*`", "", line)):  # not one quoted in prose
            raise DocsError(f"{rel}:{i + 1}: a docs-test comment must stand alone on its line: {line.strip()}")
        fence = _FENCE.match(line)
        if not fence:
            if line.strip() and pending:
                raise DocsError(f"{rel}:{pending[0].line}: a docs-test directive must be right above a code block")
            i += 1
            continue
        indent, mark, lang = len(fence.group("indent")), fence.group("fence"), fence.group("lang").lower()
        where = f"{rel}:{i + 1}"
        body, j = [], i + 1
        while j < len(lines) and not (
            lines[j].strip().startswith(mark[0] * len(mark)) and lines[j].strip().strip(mark[0]) == ""
        ):
            text = lines[j]
            body.append(text[indent:] if text[:indent].strip() == "" else text.lstrip())
            j += 1
        if j == len(lines):
            raise DocsError(f"{where}: the code block is never closed")
        if not lang:
            raise DocsError(
                f"{where}: a code block without a language; write ```text for output or a "
                f"figure, or the language of what it shows ({', '.join(LANGUAGES)})"
            )
        if lang not in LANGUAGES:
            raise DocsError(
                f"{where}: code blocks in {lang!r} are not known to tests/test_docs_examples.py; "
                f"known: {', '.join(LANGUAGES)}"
            )
        if pending and lang in OUTPUT:
            raise DocsError(f"{where}: a docs-test directive above a ```{lang} block, which never runs")
        if any(d.kind == "fails" for d in pending) and lang not in SHELL:
            raise DocsError(
                f"{where}: docs-test fails is for shell blocks (their commands' exit status), not for a ```{lang} block"
            )
        block = Block(rel, i + 1, lang, "\n".join(body) + ("\n" if body else ""), tuple(pending))
        for d in block.directives:
            if d.kind == "skip" and d.texts and lang not in SHELL:
                raise DocsError(
                    f'{rel}:{d.line}: skip "TEXT" names commands of a shell block, not of a ```{lang} block'
                )
            if d.kind == "skip" and d.texts and not any(any(t in c.text for t in d.texts) for c in block.commands()):
                raise DocsError(
                    f"{rel}:{d.line}: skip {' '.join(map(repr, d.texts))} matches no command of the block below"
                )
        if lang == "console" and not block.commands():
            raise DocsError(f"{where}: a console block without a `$ ` command; write ```text for output alone")
        blocks.append(block)
        pending = []
        i = j + 1
    if pending:
        raise DocsError(f"{rel}:{pending[0].line}: a docs-test directive must be right above a code block")
    return blocks


def doc_files(root: Path = ROOT) -> list[Path]:
    """README.md and every docs/*.md, in that order."""
    return [root / "README.md"] + sorted((root / "docs").glob("*.md"))


# ---------------------------------------------------------------------------------------------------
# Stand-in data sets in the published layouts
# ---------------------------------------------------------------------------------------------------
def write_standin_data(root: Path) -> Path:
    """Small data sets in the layouts the tasks read, for the commands that name a published data
    set: ListOps (the LRA generator, 200/64/64 sequences of 64-256 tokens), CIFAR-10 (5 training
    batches of 1010 random images, the loader keeps 5000 for validation, and a test batch of 64) and
    IMDb (a few reviews per split and label). Returns ``root``."""
    import pickle

    import numpy as np

    from longrange.data.generate.listops import generate

    generate(
        root / "listops",
        n_train=200,
        n_val=64,
        n_test=64,
        min_length=64,
        max_length=256,
        max_depth=6,
        max_args=5,
        seed=0,
        quiet=True,
    )
    cifar = root / "cifar10" / "cifar-10-batches-py"
    cifar.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name, n in [(f"data_batch_{i}", 1010) for i in range(1, 6)] + [("test_batch", 64)]:
        with open(cifar / name, "wb") as f:
            pickle.dump(
                {
                    b"data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8),
                    b"labels": rng.integers(0, 10, size=n).tolist(),
                    b"batch_label": name.encode(),
                },
                f,
            )
    with open(cifar / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [b"class%d" % i for i in range(10)]}, f)
    words = "a film of great and terrible moments with actors who act and a plot that goes nowhere".split()
    for split in ("train", "test"):
        for label in ("pos", "neg"):
            folder = root / "text" / "aclImdb" / split / label
            folder.mkdir(parents=True)
            for i in range(12):
                review = " ".join(words[(i + k) % len(words)] for k in range(30 + i))
                (folder / f"{i}_{8 if label == 'pos' else 2}.txt").write_text(review, encoding="utf-8")
    return root


# ---------------------------------------------------------------------------------------------------
# Running the blocks of one page
# ---------------------------------------------------------------------------------------------------
@dataclass
class Outcome:
    """What running a block gave: its exit status, output, and the Markdown line of the failing command."""

    status: int
    output: str
    line: int | None = None
    timed_out: bool = False


class BlockFailed(AssertionError):
    pass


@dataclass
class Page:
    """The blocks of one Markdown file, run in order in one working directory."""

    path: str
    workdir: Path
    env: dict[str, str]
    #: How Python blocks run: the server's ``python`` where it runs, else this interpreter.
    python: str = sys.executable
    #: The directory of the server's ``longrange`` (first on ``PATH``), if it runs.
    server_bin: str | None = None
    done: set[str] = field(default_factory=set)
    setups: set[str] = field(default_factory=set)
    cwd: Path | None = None

    def prepare(self, data: Path) -> None:
        """The working directory: the repository's docs/ and benchmarks/ (copies) and data/ with the
        stand-in data sets (a copy, except CIFAR-10, which no command writes and is linked)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        for name in ("docs", "benchmarks"):
            shutil.copytree(ROOT / name, self.workdir / name, ignore=shutil.ignore_patterns("__pycache__"))
        (self.workdir / "data").mkdir()
        for child in data.iterdir():
            if child.name == "cifar10":
                (self.workdir / "data" / child.name).symlink_to(child, target_is_directory=True)
            elif child.is_dir():
                shutil.copytree(child, self.workdir / "data" / child.name)
        self.cwd = self.workdir

    def run(self, block: Block, skipped: set[int] = frozenset(), direct: bool = False) -> Outcome:
        """Run one block (its ``setup`` commands first, once per page); ``skipped``: the block's line
        indices of commands that must not run; ``direct``: with the installed ``longrange`` and this
        Python instead of the server (slow blocks: whatever inspects its processes sees the real ones)."""
        self._direct = direct
        for d in block.directives:
            if d.kind == "setup" and d.command not in self.setups:
                result = self._shell(d.command + "\n", block.line, DEFAULT_TIMEOUT * 2, {}, keep_state=False)
                if result.status:
                    raise BlockFailed(
                        f"{block.id}: its setup command `{d.command}` failed with status "
                        f"{result.status}:\n{tail(result.output)}"
                    )
                self.setups.add(d.command)
        if block.lang in SHELL:
            result = self._shell(shell_script(block, skipped), block.line + 1, block.timeout, block.env)
            if block.fails_reason and result.status == 0:  # it failed as shown: did it say what the page shows?
                printed = normalise_output(result.output)
                for shown in block.shown_outputs():
                    if normalise_output(shown) not in printed:
                        result.status = 1
                        result.output += (
                            f"\ndocs-test: {block.id} shows an output that the command did not "
                            f"print (numbers aside):\n{shown}"
                        )
            return result
        if block.lang in PYTHON:
            return self._run_python(block)
        if block.lang in YAML + JSON:
            return self._data(block)
        raise AssertionError(f"{block.id}: a ```{block.lang} block does not run")

    # -- shell --------------------------------------------------------------------------------------
    def _shell(
        self, script: str, first_line: int, timeout: int, extra: dict[str, str], keep_state: bool = True
    ) -> Outcome:
        state = self.workdir / ".docs-test"
        state.mkdir(exist_ok=True)
        failed, env_file, cwd_file = state / "failed", state / "env", state / "cwd"
        for f in (failed, env_file, cwd_file):
            f.unlink(missing_ok=True)
        header = f"set -eo pipefail; {FAILS_FUNCTION}\ntrap 'echo \"$LINENO $?\" > {shlex.quote(str(failed))}' ERR\n"
        footer = f"\nenv -0 > {shlex.quote(str(env_file))}\npwd > {shlex.quote(str(cwd_file))}\n"
        script_file = state / "block.sh"
        script_file.write_text(header + script + footer)
        result = run_process(["bash", str(script_file)], self.cwd or self.workdir, self._env(extra), timeout)
        if failed.is_file():
            number, _, status = failed.read_text().strip().partition(" ")
            result.line = first_line + int(number) - 3  # the header's two lines; LINENO counts from 1
            result.status = result.status or int(status or 1)
        if result.status == 0 and keep_state and env_file.is_file():
            values = env_file.read_bytes().split(b"\0")
            self.env = dict(v.decode().split("=", 1) for v in values if b"=" in v)
            self.env = {k: v for k, v in self.env.items() if not k.startswith("BASH_FUNC_")}
            for k in extra:  # a block's own directive variables do not carry over
                self.env.pop(k, None)
            self.cwd = Path(cwd_file.read_text().strip())
        return result

    _direct = False

    def _env(self, extra: dict[str, str]) -> dict[str, str]:
        env = {**self.env, **extra}
        if self._direct and self.server_bin:
            env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != self.server_bin)
        return env

    def _python(self) -> str:
        return sys.executable if self._direct else self.python

    # -- python -------------------------------------------------------------------------------------
    def _run_python(self, block: Block) -> Outcome:
        cwd = self.cwd or self.workdir
        name = block.file_name or f".docs-test/{Path(block.path).stem}-{block.line}.py"
        script = cwd / name
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(block.text)
        return run_process([self._python(), name], cwd, self._env(block.env), block.timeout)

    # -- yaml, json ---------------------------------------------------------------------------------
    def _data(self, block: Block) -> Outcome:
        """Parse the block; write it where its first line names a file; an experiment (or a part of
        one: only sections of an experiment at the top) is checked by the config loader, in a
        process of its own with the block's environment (plugins)."""
        cwd = self.cwd or self.workdir
        if block.lang in JSON:
            try:
                json.loads(block.text)
            except ValueError as err:
                return Outcome(1, f"{block.id}: not valid JSON: {err}")
            return Outcome(0, "")
        name = block.file_name
        path = cwd / (name or f".docs-test/{Path(block.path).stem}-{block.line}.yaml")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(block.text)
        check = (
            "import dataclasses, sys, yaml\n"
            "from longrange.experiment.config import ExperimentConfig, resolve\n"
            "data = yaml.safe_load(open(sys.argv[1]).read())\n"
            "sections = {f.name for f in dataclasses.fields(ExperimentConfig)} | {'base'}\n"
            "if isinstance(data, dict) and data and set(data) <= sections:\n"
            "    resolve(config=sys.argv[1])\n"
            "    print('an experiment, checked')\n"
            "else:\n"
            "    print('parsed; not an experiment')\n"
        )
        return run_process([self._python(), "-c", check, str(path)], cwd, self._env(block.env), block.timeout)


def shell_script(block: Block, skipped: set[int] = frozenset()) -> str:
    """The block as a bash script of as many lines, with the skipped commands' lines made no-ops
    and a console block's output lines and prompts removed."""
    lines = block.text.splitlines()
    commands = block.commands()
    out = list(lines)
    if block.lang == "console":
        out = [""] * len(lines)
        for c in commands:
            for k, i in enumerate(c.lines):
                text = lines[i].strip()
                out[i] = text[2:] if k == 0 and text.startswith("$ ") else lines[i]
    for c in commands:
        if c.lines[0] in skipped:
            for k, i in enumerate(c.lines):
                out[i] = ":  # skipped" if k == 0 else ""
        elif block.fails_reason:  # the command must fail (see FAILS_FUNCTION)
            out[c.lines[0]] = f"{FAILS_FUNCTION.split('(')[0]} {out[c.lines[0]].strip()}"
    return "\n".join(out) + "\n"


#: A shell function that runs its arguments as a command and fails when the command succeeds: the
#: commands of a block whose directive says it ``fails`` run through it.
FAILS_FUNCTION = (
    'docs_test_fails() { if "$@"; then echo "docs-test: the command succeeded, but the page '
    'shows it failing: $*" >&2; return 1; fi; }'
)


def normalise_output(text: str) -> str:
    """Output as :class:`Page` compares it with a page's: numbers replaced by ``N``, whitespace (and so
    the page's line breaks) collapsed to single spaces."""
    return " ".join(re.sub(r"\d+(?:[.,]\d+)*", "N", text).split())


def tail(text: str, n: int = 60) -> str:
    lines = text.rstrip().splitlines()
    return "\n".join((["..."] if len(lines) > n else []) + lines[-n:])


def run_process(argv: list[str], cwd: Path, env: dict[str, str], timeout: int) -> Outcome:
    """Run ``argv`` in its own process group with stdout and stderr together; on timeout the group
    is killed and the outcome says so."""
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        return Outcome(proc.returncode, out.decode(errors="replace"))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # a process outside the group holds the output open
            proc.stdout.close()
            proc.wait()
            out = b"(the output is lost: a process outside the block's process group kept it open)"
        return Outcome(124, out.decode(errors="replace"), timed_out=True)


# ---------------------------------------------------------------------------------------------------
# The server: one process with longrange imported, forked for every command
# ---------------------------------------------------------------------------------------------------
SHIM = """#!/bin/sh
'''exec' {python_sh} -S "$0" "$@"
' '''
# (a shell line that runs this file with the interpreter: a shebang cannot hold a path with spaces)
# longrange, run by the docs-test server (tests/docs_examples.py): the arguments, environment,
# directory and standard streams go to a process forked from one that has imported longrange.
import json, os, socket, struct, sys
try:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect({socket!r})
except OSError:
    os.execv({real!r}, [{real!r}] + sys.argv[1:])
payload = json.dumps({{"mode": {mode!r}, "real": {real!r}, "argv": sys.argv[1:], "cwd": os.getcwd(),
                      "env": dict(os.environ)}}).encode()
socket.send_fds(conn, [struct.pack("!Q", len(payload)) + payload], [0, 1, 2])
reply = b""
while len(reply) < 4:
    chunk = conn.recv(4 - len(reply))
    if not chunk:
        sys.exit(1)
    reply += chunk
sys.exit(struct.unpack("!i", reply)[0])
"""


#: The server's ``python``: runs ``SCRIPT ARGS...`` or ``-c CODE ARGS...`` as the interpreter would.
PYTHON_SHIM = "docs-test-python"


class Server:
    """The docs-test server and the ``bin`` directory of its ``longrange`` script."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.socket = str(directory / "server.sock")
        self.bin = directory / "bin"
        self.proc: subprocess.Popen | None = None

    def start(self, env: dict[str, str], timeout: float = 120) -> bool:
        """Start the server and write the ``longrange`` script; False (and no script) if it does not come up."""
        real = shutil.which("longrange", path=env.get("PATH"))
        if real is None:
            return False
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "serve", self.socket], env=env, stdin=subprocess.DEVNULL, start_new_session=True
        )
        deadline = time.time() + timeout
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                return False
            time.sleep(0.05)
        self.bin.mkdir(exist_ok=True)
        for name, mode, target in (("longrange", "longrange", real), (PYTHON_SHIM, "python", sys.executable)):
            shim = self.bin / name
            shim.write_text(
                SHIM.format(python_sh=shlex.quote(sys.executable), socket=self.socket, real=target, mode=mode)
            )
            shim.chmod(0o755)
        return True

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc = None


def _recv_request(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    while len(data) < 8:
        more = conn.recv(8 - len(data))
        if not more:
            raise ConnectionError("the request ended early")
        data += more
    (size,), data = struct.unpack("!Q", data[:8]), data[8:]
    while len(data) < size:
        more = conn.recv(min(1 << 16, size - len(data)))
        if not more:
            raise ConnectionError("the request ended early")
        data += more
    return json.loads(data), list(fds)


def _child(request: dict, fds: list[int], conn: socket.socket, listener: socket.socket) -> int:
    """In the forked process: become the command (streams, environment, directory) and run it."""
    import atexit
    import importlib
    import runpy
    import threading
    import types

    listener.close()
    os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])

    def watch() -> None:  # the caller gone (killed on a timeout): end this command and what it started
        try:
            conn.recv(1)
        except OSError:
            pass
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, daemon=True).start()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    argv = list(request["argv"])
    extra = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    importlib.invalidate_caches()
    code = 0
    try:
        if request["mode"] == "longrange":  # as the installed script: its directory first on sys.path
            sys.path[:1] = [os.path.dirname(request["real"])] + extra
            main = types.ModuleType("__main__")
            main.__file__ = request["real"]
            sys.modules["__main__"] = main
            sys.argv = ["longrange", *argv]
            from longrange.cli import main as cli_main

            code = cli_main(argv)
        elif argv[:1] == ["-c"]:  # python -c CODE ARGS: the working directory first on sys.path
            sys.path[:1] = [""] + extra
            sys.argv = ["-c", *argv[2:]]
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(argv[1], "<string>", "exec"), main.__dict__)
        else:  # python SCRIPT ARGS: the script's directory first on sys.path
            sys.path[:1] = [os.path.dirname(os.path.abspath(argv[0]))] + extra
            sys.argv = argv
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if not isinstance(exit_.code, (int, type(None))):
            print(exit_.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return int(code or 0)


#: What the server imports before it forks: torch and every command module, and the libraries the
#: commands import when they train and report (TensorBoard's writer, matplotlib).
PRELOAD = (
    "longrange.cli",
    "longrange.experiment.compare",
    "longrange.experiment.execute",
    "longrange.report.writer",
    "longrange.train.trained",
    "matplotlib.pyplot",
    "torch.utils.tensorboard",
)


def serve(path: str) -> None:
    """Import longrange, then fork for every request on the Unix socket ``path`` until the parent goes."""
    import importlib
    import select

    for name in PRELOAD:  # once here, instead of in every command
        try:
            importlib.import_module(name)
        except ImportError:
            pass

    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".tmp")
    listener.listen(16)
    os.rename(path + ".tmp", path)
    children: dict[int, socket.socket] = {}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while os.getppid() == parent:
        ready, _, _ = select.select([listener], [], [], 0.1)
        if ready:
            conn, _ = listener.accept()
            try:
                request, fds = _recv_request(conn)
            except (ConnectionError, ValueError, OSError):
                conn.close()
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    code = _child(request, fds, conn, listener)
                finally:
                    os._exit(code)
            for fd in fds:
                os.close(fd)
            children[pid] = conn
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = children.pop(pid, None)
            if conn is not None:
                code = os.waitstatus_to_exitcode(status)
                try:
                    conn.sendall(struct.pack("!i", code if code >= 0 else 128 - code))
                except OSError:
                    pass
                conn.close()


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "serve":
    serve(sys.argv[2])
