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

from longrange.data.dataset import TaskData
from longrange.data.files import load_split_files, token_spec
from longrange.data.locations import task_dir
from longrange.data.packing import pack_split
from longrange.data.reading import BadRecords
from longrange.data.registry import register_task
from longrange.data.spec import TaskSpec
from longrange.data.tokenize import Vocabulary
from longrange.data.tsv import read_tsv
from longrange.errors import DataFormatError

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


#: How to read a sequence longer than seq_len, in the loader's error.
TOO_LONG_HINT = (
    "raise the task option seq_len: task.options.seq_len=N, or -o seq_len=N with `longrange data`; "
    "or cut long sequences with task.options.truncate=true / -o truncate=true"
)


def encode_source(
    source: str, vocab: Vocabulary, seq_len: int, truncate: bool, path: Path, number: int, hint: str
) -> list[int]:
    """The ids of one source followed by ``<eos>``, at most ``seq_len``: an empty source is an error,
    and so is a longer one unless ``truncate`` (then it is cut to ``seq_len - 1`` tokens before the
    ``<eos>``, as the S4 pipeline does); errors name ``path`` and line ``number``, ``hint`` says what to do."""
    ids = vocab.encode(tokenize_source(source), path=path, line=number)
    if not ids:
        raise DataFormatError("empty Source", path, number)
    if len(ids) + 1 > seq_len:
        if not truncate:
            raise DataFormatError(f"{len(ids)} tokens + <eos> exceed seq_len {seq_len} ({hint})", path, number)
        ids = ids[: seq_len - 1]
    return ids + [vocab.eos_id]


def listops_spec(seq_len: int = 2048, truncate: bool = False) -> TaskSpec:
    return token_spec(
        "listops",
        seq_len,
        n_classes=10,
        mask_ratio=0.1,
        description="LRA ListOps: value (0-9) of a nested MIN/MAX/MED/SM expression; tokens, + <eos>",
        layout="listops/basic_{train,val,test}.tsv (tab-separated, header Source<TAB>Target; 96k/2k/2k in LRA)",
        obtain=OBTAIN,
    )


def read_listops_file(
    path: Path, vocab: Vocabulary, seq_len: int, truncate: bool = False, bad: BadRecords | None = None
) -> tuple[list[list[int]], list[int]]:
    """Token ids (each ending in ``<eos>``, at most ``seq_len``) and labels of one ``.tsv`` file.

    A sequence longer than ``seq_len`` is an error naming its line unless ``truncate`` (then it is
    cut to ``seq_len - 1`` tokens before the ``<eos>``, as the S4 pipeline does).
    """

    def parse(cols: list[str], number: int) -> tuple[list[int], int]:
        source, target = cols
        try:
            label = int(target)
        except ValueError:
            label = -1
        if not 0 <= label <= 9 or target.strip() != target:
            raise DataFormatError(f"Target must be an integer 0-9, found {target!r}", path, number)
        return encode_source(source, vocab, seq_len, truncate, path, number, TOO_LONG_HINT), label

    records = read_tsv(path, HEADER, parse, bad, header=HEADER, empty="no samples after the header")
    return [ids for ids, _ in records], [label for _, label in records]


def listops_expected_paths(data_dir: Path, **options) -> list[Path]:
    folder = task_dir(data_dir, SUBDIR, SPLITS["train"])
    return [folder / name for name in SPLITS.values()]


def load_listops(
    data_dir: Path, spec: TaskSpec, seed: int = 0, skip_bad: bool = False, seq_len: int = 2048, truncate: bool = False
) -> TaskData:
    """Load ListOps from ``data_dir/listops`` (or ``data_dir`` itself when it holds the files)."""
    vocab = listops_vocabulary()

    def pack(readings: dict) -> dict:
        out: dict = {"tokens": list(vocab.tokens)}
        for split, (seqs, labels) in readings.items():
            pack_split(out, split, seqs, labels, len(vocab))
        return out

    return load_split_files(
        spec,
        data_dir,
        dict(zip(SPLITS, listops_expected_paths(data_dir))),
        obtain=OBTAIN,
        options={"seq_len": seq_len, "truncate": truncate, "skip_bad": skip_bad},
        version=LOADER_VERSION,
        skip_bad=skip_bad,
        read=lambda path, bad: read_listops_file(path, vocab, seq_len, truncate, bad),
        pack=pack,
        vocab=vocab,
    )


register_task(
    "listops", listops_spec, load_listops, {"seq_len": 2048, "truncate": False}, expected=listops_expected_paths
)
