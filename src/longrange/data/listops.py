"""ListOps (Long Range Arena): classify the value 0-9 of a nested list-operation expression.

Files (the LRA release layout, or the output of ``longrange data generate listops``)::

    <data_dir>/listops/basic_{train,val,test}.tsv      header "Source<TAB>Target"

A source is fully parenthesised, e.g. ``( ( ( [MAX 4 ) 5 ) ] )``. As in the LRA and S4 pipelines
the parentheses are dropped and the rest split on whitespace, giving tokens such as
``[MAX 4 5 ]``; the closing bracket is a token of its own (the S4 code renames it ``X``, an
equivalent spelling). An ``<eos>`` is appended, as the S4 pipeline does.

The vocabulary is fixed (the 10 digits, 4 operators and ``]`` after the 5 specials, 20 ids) and
strict, so every split and every generated set share the same ids and a stray token is reported
with its file and line instead of becoming ``<unk>``.

A UTF-8 byte-order mark before the header and blank lines at the end of a file are ignored
(``data/tsv.py``); a blank line between records is an error naming its line.
"""
from __future__ import annotations

from pathlib import Path

from longrange.data.cache import cached
from longrange.data.tasks import (
    BadRecords,
    TaskData,
    TaskSpec,
    pack_split,
    register_task,
    require_files,
    task_dir,
    unpack_split,
)
from longrange.data.tokenize import Vocabulary
from longrange.data.tsv import read_tsv
from longrange.errors import ConfigError, DataFormatError

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
CLOSE = "]"
DIGITS = tuple(str(d) for d in range(10))
#: The task's tokens, in id order after the specials.
LISTOPS_TOKENS = DIGITS + OPERATORS + (CLOSE,)

SPLITS = {"train": "basic_train.tsv", "val": "basic_val.tsv", "test": "basic_test.tsv"}
HEADER = ["Source", "Target"]
SUBDIR = "listops"
OBTAIN = (
    "generate it on first use with task.generate=default in the experiment (the LRA generator at LRA's sizes; "
    "task.generate=short: the demo's short ListOps), or once with `longrange data generate listops --out "
    "<data_dir>/listops` (the LRA generator; "
    "add --n-train 2000 --min-length 50 --max-length 256 for a small quick set), or download "
    "lra_release.gz from https://github.com/google-research/long-range-arena and copy "
    "lra_release/listops-1000/basic_{train,val,test}.tsv to <data_dir>/listops/"
)
#: Bumped when the prepared output of this loader changes.
LOADER_VERSION = 3


def listops_vocabulary() -> Vocabulary:
    return Vocabulary(LISTOPS_TOKENS, strict=True)


def tokenize_source(source: str) -> list[str]:
    """Tokens of a ListOps source: parentheses removed, split on whitespace."""
    return source.replace("(", " ").replace(")", " ").split()


def listops_spec(seq_len: int = 2048, truncate: bool = False) -> TaskSpec:
    if seq_len < 2:
        raise ConfigError(f"listops option seq_len must be >= 2, got {seq_len}")
    return TaskSpec(
        name="listops",
        input_kind="tokens",
        seq_len=seq_len,
        n_classes=10,
        metric="accuracy",
        mask_ratio=0.1,
        description="LRA ListOps: value (0-9) of a nested MIN/MAX/MED/SM expression; tokens, + <eos>",
        layout="listops/basic_{train,val,test}.tsv (tab-separated, header Source<TAB>Target; 96k/2k/2k in LRA)",
        obtain=OBTAIN,
    )


def read_listops_file(path: Path, vocab: Vocabulary, seq_len: int, truncate: bool = False,
                      bad: BadRecords | None = None) -> tuple[list[list[int]], list[int]]:
    """Token ids (each ending in ``<eos>``, at most ``seq_len``) and labels of one ``.tsv`` file.

    A sequence longer than ``seq_len`` is an error naming its line unless ``truncate`` (then it is
    cut to ``seq_len - 1`` tokens before the ``<eos>``, as the S4 pipeline does).
    """
    eos = vocab.eos_id

    def parse(cols: list[str], number: int) -> tuple[list[int], int]:
        source, target = cols
        try:
            label = int(target)
        except ValueError:
            label = -1
        if not 0 <= label <= 9 or target.strip() != target:
            raise DataFormatError(f"Target must be an integer 0-9, found {target!r}", path, number)
        ids = vocab.encode(tokenize_source(source), path=path, line=number)
        if not ids:
            raise DataFormatError("empty Source", path, number)
        if len(ids) + 1 > seq_len:
            if not truncate:
                raise DataFormatError(
                    f"{len(ids)} tokens + <eos> exceed seq_len {seq_len} "
                    "(raise the task option seq_len: task.options.seq_len=N, or -o seq_len=N with `longrange data`; "
                    "or cut long sequences with task.options.truncate=true / -o truncate=true)", path, number)
            ids = ids[: seq_len - 1]
        return ids + [eos], label

    records = read_tsv(path, HEADER, parse, bad, header=HEADER, empty="no samples after the header")
    return [ids for ids, _ in records], [label for _, label in records]


def listops_expected_paths(data_dir: Path, **options) -> list[Path]:
    folder = task_dir(data_dir, SUBDIR, SPLITS["train"])
    return [folder / name for name in SPLITS.values()]


def load_listops(data_dir: Path, spec: TaskSpec, seed: int = 0, skip_bad: bool = False,
                 seq_len: int = 2048, truncate: bool = False) -> TaskData:
    """Load ListOps from ``data_dir/listops`` (or ``data_dir`` itself when it holds the files)."""
    paths = listops_expected_paths(data_dir)
    require_files(paths, OBTAIN)
    vocab = listops_vocabulary()

    def build() -> dict:
        bad = BadRecords(skip_bad)
        out: dict = {"tokens": list(vocab.tokens)}
        for split, path in zip(SPLITS, paths):
            seqs, labels = read_listops_file(path, vocab, seq_len, truncate, bad)
            pack_split(out, split, seqs, labels, len(vocab))
        out["skipped"] = bad.counts
        return out

    options = {"seq_len": seq_len, "truncate": truncate, "skip_bad": skip_bad}
    prepared = cached(data_dir, "listops", paths, options, build, version=LOADER_VERSION)
    if prepared["tokens"] != list(vocab.tokens):
        raise DataFormatError("prepared vocabulary differs from the ListOps vocabulary; delete the cache entry",
                              paths[0])
    splits = {split: unpack_split(prepared, split) for split in SPLITS}
    return TaskData(spec, splits["train"], splits["val"], splits["test"], vocab=vocab,
                    skipped=dict(prepared["skipped"]), info={"source": str(paths[0].parent)})


register_task("listops", listops_spec, load_listops, {"seq_len": 2048, "truncate": False},
              expected=listops_expected_paths)
