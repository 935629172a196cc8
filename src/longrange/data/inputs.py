"""New inputs for a trained model, read from a file in the task's own format (``longrange predict``).

    records = read_inputs("listops", Path("new.tsv"), vocab, spec, seq_len=2048, truncate=False)
    records[0].id, records[0].item["inputs"], records[0].item.get("target")

A reader turns one file into :class:`InputRecord`\\ s, each with the id by which its prediction is
written (the line number, or the file's name) and a dataset item (``data/batch.py``), whose
``target`` is present only when the file gives a label. It encodes with the vocabulary it is given
(a trained run's, never one built from the new file). Readers are registered per task:

    register_input_reader("my-task", read_my_inputs)   # read_my_inputs(path, vocab, spec, **options)

Built in: ``listops`` (the task's TSV, ``Source<TAB>Target``; a file whose header is ``Source``
alone holds unlabelled sources), ``text`` (one review ``.txt`` file, or a folder of them; a file in a
``pos`` or ``neg`` folder is labelled by it), ``retrieval`` (the task's five-column TSV).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from longrange.data.tasks import TaskSpec
from longrange.data.tokenize import Vocabulary
from longrange.errors import ConfigError, DataFormatError, DataMissingError
from longrange.registry import Registry


@dataclass
class InputRecord:
    """One new input: the id its prediction is written under, and its dataset item."""

    id: str
    item: dict[str, Any]


#: Readers of new inputs by task name: ``reader(path, vocab, spec, **task_options) -> list[InputRecord]``.
INPUT_READERS: Registry = Registry("input reader")


def register_input_reader(task: str, reader: Callable[..., list[InputRecord]]) -> None:
    """Register how ``longrange predict`` reads new inputs of ``task`` (replacing an earlier reader)."""
    INPUT_READERS.register(task, reader, replace=True)


def read_inputs(task: str, path: str | Path, vocab: Vocabulary | None, spec: TaskSpec, **options: Any) -> list[InputRecord]:
    """The records of ``path`` read by ``task``'s reader (errors name the file and line at fault)."""
    path = Path(path)
    if task not in INPUT_READERS.names():
        readers = ", ".join(INPUT_READERS.names())
        raise ConfigError(f"task {task} has no reader of new inputs (tasks with one: {readers}); register one with "
                          "longrange.data.inputs.register_input_reader")
    if not path.exists():
        raise DataMissingError(f"expected the input file {path} but it does not exist")
    records = INPUT_READERS.get(task)(path, vocab, spec, **options)
    if not records:
        raise DataFormatError("no inputs", path)
    return records


def _need_vocab(vocab: Vocabulary | None, task: str) -> Vocabulary:
    if vocab is None:
        raise ConfigError(f"task {task} reads tokens, but the run has no vocabulary")
    return vocab


def _tokens(ids: list[int] | Any) -> torch.Tensor:
    return torch.as_tensor(ids, dtype=torch.long)


# ----------------------------------------------------------------------------------- ListOps
def read_listops_inputs(path: Path, vocab: Vocabulary | None, spec: TaskSpec, seq_len: int = 2048,
                        truncate: bool = False, **_: Any) -> list[InputRecord]:
    """ListOps sources, labelled (the task's ``Source<TAB>Target``) or not (header ``Source``); ids
    are line numbers."""
    from longrange.data.listops import HEADER, encode_source, read_listops_file
    from longrange.data.tsv import check_not_blank, tsv_lines

    vocab = _need_vocab(vocab, "listops")
    lines = tsv_lines(path)
    first = next(lines, None)
    if first is None:
        raise DataFormatError("no header line (the file holds only blank lines)", path)
    header = first[1].split("\t")
    if header == HEADER:  # the task's own format: read as the loader reads it (one record per line after the header)
        seqs, labels = read_listops_file(path, vocab, seq_len, truncate)
        return [InputRecord(str(i + 2), {"inputs": _tokens(s), "target": torch.tensor(y)})
                for i, (s, y) in enumerate(zip(seqs, labels))]
    if header != HEADER[:1]:
        raise DataFormatError(f"expected the header 'Source<TAB>Target' (or 'Source' for unlabelled sources), "
                              f"found {first[1][:60]!r}", path, 1)
    records = []
    for number, text in lines:
        check_not_blank(text, path, number)
        if "\t" in text:
            raise DataFormatError("a file with the header 'Source' holds one column; found a tab", path, number)
        ids = encode_source(text, vocab, seq_len, truncate, path, number,
                            "raise the task option seq_len, or cut long sequences with truncate=true")
        records.append(InputRecord(str(number), {"inputs": _tokens(ids)}))
    return records


# ----------------------------------------------------------------------------------- Text (IMDB)
def read_text_inputs(path: Path, vocab: Vocabulary | None, spec: TaskSpec, seq_len: int = 4096,
                     **_: Any) -> list[InputRecord]:
    """One review (a ``.txt`` file) or every ``.txt`` file under a folder, in name order; ids are
    the files' paths (relative to the folder). A file inside a ``pos`` or ``neg`` folder is labelled."""
    from longrange.data.text import LABELS, encode_documents, read_review

    vocab = _need_vocab(vocab, "text")
    files = [path] if path.is_file() else sorted(path.rglob("*.txt"))
    if not files:
        raise DataMissingError(f"no .txt reviews in {path}")
    texts = [read_review(f) for f in files]
    records = []
    for f, ids in zip(files, encode_documents(texts, vocab, seq_len - 1)):
        item: dict[str, Any] = {"inputs": _tokens(ids)}
        if f.parent.name in LABELS:
            item["target"] = torch.tensor(LABELS[f.parent.name])
        records.append(InputRecord(str(f.relative_to(path)) if f != path else f.name, item))
    return records


# ----------------------------------------------------------------------------------- Retrieval (AAN)
def read_retrieval_inputs(path: Path, vocab: Vocabulary | None, spec: TaskSpec, seq_len: int = 4000,
                          **_: Any) -> list[InputRecord]:
    """Pairs of documents in the task's five-column TSV (label, id1, id2, text1, text2); ids are line numbers."""
    from longrange.data.retrieval import read_pairs_file
    from longrange.data.text import encode_documents

    vocab = _need_vocab(vocab, "retrieval")
    texts1, texts2, labels = read_pairs_file(path)
    docs1, docs2 = encode_documents(texts1, vocab, seq_len - 1), encode_documents(texts2, vocab, seq_len - 1)
    return [InputRecord(str(i + 1), {"inputs": _tokens(a), "inputs2": _tokens(b), "target": torch.tensor(y)})
            for i, (a, b, y) in enumerate(zip(docs1, docs2, labels))]


register_input_reader("listops", read_listops_inputs)
register_input_reader("text", read_text_inputs)
register_input_reader("retrieval", read_retrieval_inputs)
