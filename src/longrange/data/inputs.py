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
``pos`` or ``neg`` folder is labelled by it), ``retrieval`` (the task's five-column TSV); the
generated sequence tasks ``selective-copying``, ``induction-heads``, ``mqar`` and
``associative-recall`` (JSON Lines, one input a line: ``{"id": "a", "tokens": [...]}`` in the task's
own tokens ``0 .. vocab_size - 1``, with ``"answers"`` where the inputs are labelled, see
:data:`SEQUENCE_LAYOUTS`); the pixel tasks ``pathfinder``, ``path-x``, ``path-x-256``, ``image``,
``image-numeric`` and ``scifar`` (one PNG image, or a folder of them). A record of a per-position
task carries the positions the task scores (:attr:`InputRecord.positions`): its prediction is
reported there only; :attr:`InputRecord.name_class` writes a predicted class in the task's own
tokens. A task without a reader says why (:data:`NO_READER`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from longrange.data.spec import TaskSpec
from longrange.data.tokenize import FIRST_TOKEN_ID as FIRST_ID
from longrange.data.tokenize import Vocabulary
from longrange.errors import ConfigError, DataFormatError, DataMissingError
from longrange.registry import Registry


@dataclass
class InputRecord:
    """One new input: the id its prediction is written under, and its dataset item."""

    id: str
    item: dict[str, Any]
    #: Per-position tasks: the positions the task scores (its answers), where the prediction is
    #: reported; None: the prediction of the whole input (a class), or at every position.
    positions: list[int] | None = None
    #: A predicted class (and a target) in the task's own terms, e.g. a vocabulary id as the task's
    #: token; None: the class index as it is.
    name_class: Callable[[int], Any] | None = None


#: Readers of new inputs by task name: ``reader(path, vocab, spec, **task_options) -> list[InputRecord]``.
INPUT_READERS: Registry = Registry("input reader")


def register_input_reader(task: str, reader: Callable[..., list[InputRecord]]) -> None:
    """Register how ``longrange predict`` reads new inputs of ``task`` (replacing an earlier reader)."""
    INPUT_READERS.register(task, reader, replace=True)


def read_inputs(
    task: str, path: str | Path, vocab: Vocabulary | None, spec: TaskSpec, **options: Any
) -> list[InputRecord]:
    """The records of ``path`` read by ``task``'s reader (errors name the file and line at fault)."""
    path = Path(path)
    if task not in INPUT_READERS.names():
        raise ConfigError(no_reader_message(task))
    if not path.exists():
        raise DataMissingError(f"expected the input file {path} but it does not exist")
    records = INPUT_READERS.get(task)(path, vocab, spec, **options)
    if not records:
        raise DataFormatError("no inputs", path)
    return records


#: Why a registered task has no reader of new inputs (``longrange predict`` says so).
NO_READER: dict[str, str] = {
    "species": "its inputs are windows of genome drawn from the species' FASTA files when the task is loaded, "
    "and a single new input has no file format of its own",
    "speech-commands": "its inputs are audio clips that the loader turns into MFCC features or 16 kHz waveforms "
    "from the data set's folders; a reader of single new clips is not provided",
    **{
        name: "its inputs are PPG and ECG recordings of 4000 steps stored as NumPy arrays of whole splits; a "
        "reader of single new recordings is not provided"
        for name in ("bidmc", "bidmc-hr", "bidmc-rr", "bidmc-spo2")
    },
}


def no_reader_message(task: str) -> str:
    """Why ``longrange predict`` cannot read new inputs of ``task``, and what to do instead."""
    why = NO_READER.get(task, "none is registered for it")
    readers = ", ".join(INPUT_READERS.names())
    return (
        f"task {task} has no reader of new inputs: {why}. Evaluate the run on the task's own splits with "
        f"`longrange evaluate`, or register a reader with longrange.data.inputs.register_input_reader "
        f"(tasks with one: {readers})"
    )


def _need_vocab(vocab: Vocabulary | None, task: str) -> Vocabulary:
    if vocab is None:
        raise ConfigError(f"task {task} reads tokens, but the run has no vocabulary")
    return vocab


def _tokens(ids: list[int] | Any) -> torch.Tensor:
    return torch.as_tensor(ids, dtype=torch.long)


# ----------------------------------------------------------------------------------- ListOps
def read_listops_inputs(
    path: Path, vocab: Vocabulary | None, spec: TaskSpec, seq_len: int = 2048, truncate: bool = False, **_: Any
) -> list[InputRecord]:
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
        return [
            InputRecord(str(i + 2), {"inputs": _tokens(s), "target": torch.tensor(y)})
            for i, (s, y) in enumerate(zip(seqs, labels))
        ]
    if header != HEADER[:1]:
        raise DataFormatError(
            f"expected the header 'Source<TAB>Target' (or 'Source' for unlabelled sources), found {first[1][:60]!r}",
            path,
            1,
        )
    records = []
    for number, text in lines:
        check_not_blank(text, path, number)
        if "\t" in text:
            raise DataFormatError("a file with the header 'Source' holds one column; found a tab", path, number)
        ids = encode_source(
            text,
            vocab,
            seq_len,
            truncate,
            path,
            number,
            "raise the task option seq_len, or cut long sequences with truncate=true",
        )
        records.append(InputRecord(str(number), {"inputs": _tokens(ids)}))
    return records


# ----------------------------------------------------------------------------------- Text (IMDB)
def read_text_inputs(
    path: Path, vocab: Vocabulary | None, spec: TaskSpec, seq_len: int = 4096, **_: Any
) -> list[InputRecord]:
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
def read_retrieval_inputs(
    path: Path, vocab: Vocabulary | None, spec: TaskSpec, seq_len: int = 4000, **_: Any
) -> list[InputRecord]:
    """Pairs of documents in the task's five-column TSV (label, id1, id2, text1, text2); ids are line numbers."""
    from longrange.data.retrieval import read_pairs_file
    from longrange.data.text import encode_documents

    vocab = _need_vocab(vocab, "retrieval")
    texts1, texts2, labels = read_pairs_file(path)
    docs1, docs2 = encode_documents(texts1, vocab, seq_len - 1), encode_documents(texts2, vocab, seq_len - 1)
    return [
        InputRecord(str(i + 1), {"inputs": _tokens(a), "inputs2": _tokens(b), "target": torch.tensor(y)})
        for i, (a, b, y) in enumerate(zip(docs1, docs2, labels))
    ]


# ----------------------------------------------------------------------------------- generated sequence tasks
def json_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` of a JSON Lines file: one JSON object a line (blank lines at its end
    are ignored); a line that is not one is an error naming the file and line."""
    from longrange.data.tsv import check_not_blank, tsv_lines

    for number, text in tsv_lines(path):
        check_not_blank(text, path, number)
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as err:
            raise DataFormatError(
                f"not valid JSON ({err.msg} at column {err.colno}); each line holds one JSON "
                'object such as {"id": "a", "tokens": [3, 0, 7]}',
                path,
                number,
            ) from None
        if not isinstance(obj, dict):
            raise DataFormatError(
                f'expected a JSON object such as {{"id": "a", "tokens": [3, 0, 7]}}, found a {type(obj).__name__}',
                path,
                number,
            )
        yield number, obj


def record_id(obj: dict[str, Any], seen: dict[str, int], path: Path, number: int) -> str:
    """The ``id`` field of a JSON input as text: required, a non-empty string or an integer, unique
    in the file, without tabs or line breaks (the predictions are a TSV)."""
    if "id" not in obj:
        raise DataFormatError("missing field 'id' (the id the input's prediction is written under)", path, number)
    value = obj["id"]
    if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
        raise DataFormatError(f"field 'id' must be a non-empty string or an integer, got {value!r}", path, number)
    text = str(value)
    if any(c in text for c in "\t\r\n"):
        raise DataFormatError(
            f"field 'id' {text!r} holds a tab or a line break (the predictions are a TSV)", path, number
        )
    if text in seen:
        raise DataFormatError(f"field 'id': {text!r} is also the id of line {seen[text]}", path, number)
    seen[text] = number
    return text


def _shown(value: Any, limit: int = 60) -> str:
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def int_list(obj: dict[str, Any], name: str, path: Path, number: int, required: bool = False) -> list[int] | None:
    """Field ``name`` of a JSON input as a list of integers (None when absent and not required)."""
    if name not in obj:
        if required:
            raise DataFormatError(f"missing field '{name}'", path, number)
        return None
    value = obj[name]
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise DataFormatError(f"field '{name}' must be a list of integers, got {_shown(value)}", path, number)
    return value


def check_in_range(
    values: list[int], name: str, low: int, high: int, what: str, path: Path, number: int, at: list[int] | None = None
) -> None:
    """Each of ``values`` in ``[low, high]``, else an error naming the field, the element and ``what`` it must be."""
    for i, v in enumerate(values):
        if not low <= v <= high:
            where = f"position {at[i]}" if at is not None else f"element {i}"
            raise DataFormatError(f"field '{name}', {where}: {v} is not {what} ({low}..{high})", path, number)


@dataclass(frozen=True)
class SequenceLayout:
    """What ``longrange predict`` reads and scores for one generated sequence task.

    ``scored(tokens, obj, generator, path, number)`` returns the positions the task scores (its
    questions) after checking the layout there; ``answers`` is what an answer is, as ``(low, high,
    words)`` of ``generator``'s tokens; ``classify`` marks a classification task, whose answer is a
    class (the value's index) rather than a token at a position."""

    fields: tuple[str, ...]
    scored: Callable[..., list[int]]
    answers: Callable[[Any], tuple[int, int, str]]
    classify: bool = False


def _check_pairs(tokens: list[int], gen: Any, path: Path, number: int) -> None:
    """The ``n_pairs`` key-value pairs in front: keys ``1 .. V//2 - 1`` at even positions, values
    ``V//2 .. V-1`` at odd ones."""
    n, first = gen.n_pairs, gen.first_value
    if len(tokens) < 2 * n + 1:
        raise DataFormatError(
            f"field 'tokens': {len(tokens)} tokens, fewer than the {2 * n + 1} of {n} key-value "
            "pairs in front and a query after them (n_pairs, a task option)",
            path,
            number,
        )
    check_in_range(tokens[0 : 2 * n : 2], "tokens", 1, first - 1, "a key", path, number, list(range(0, 2 * n, 2)))
    check_in_range(
        tokens[1 : 2 * n : 2], "tokens", first, gen.vocab_size - 1, "a value", path, number, list(range(1, 2 * n, 2))
    )


def _copying_scored(tokens, obj, gen, path, number) -> list[int]:
    positions = [i for i, t in enumerate(tokens) if t == gen.marker]
    if not positions:
        raise DataFormatError(
            f"field 'tokens' holds no marker ({gen.marker}): selective copying scores the positions of its markers",
            path,
            number,
        )
    return positions


def _induction_scored(tokens, obj, gen, path, number) -> list[int]:
    if tokens[-1] != gen.trigger:
        raise DataFormatError(
            f"field 'tokens' ends in {tokens[-1]}, not the trigger {gen.trigger}: induction heads "
            "asks its question at the last position, after the trigger's second occurrence",
            path,
            number,
        )
    return [len(tokens) - 1]


def _mqar_scored(tokens, obj, gen, path, number) -> list[int]:
    _check_pairs(tokens, gen, path, number)
    start, first = 2 * gen.n_pairs, gen.first_value
    queries = int_list(obj, "queries", path, number)
    if queries is None:
        if gen.random_filler:
            raise DataFormatError(
                "missing field 'queries' (the positions of the queries): the run's task has "
                "random_filler=true, so a key in the filler cannot be told from a query",
                path,
                number,
            )
        queries = [i for i in range(start, len(tokens)) if 1 <= tokens[i] < first]
        if not queries:
            raise DataFormatError(
                f"field 'tokens' holds no query (a key, 1..{first - 1}) after the {gen.n_pairs} "
                "key-value pairs in front",
                path,
                number,
            )
        return queries
    if not queries:
        raise DataFormatError("field 'queries' is empty: give the position of each query", path, number)
    check_in_range(queries, "queries", start, len(tokens) - 1, "a position after the key-value pairs", path, number)
    if len(set(queries)) != len(queries):
        raise DataFormatError(f"field 'queries' names a position twice: {_shown(queries)}", path, number)
    check_in_range([tokens[q] for q in queries], "tokens", 1, first - 1, "a key (a query)", path, number, queries)
    return sorted(queries)


def _recall_scored(tokens, obj, gen, path, number) -> list[int]:
    _check_pairs(tokens, gen, path, number)
    check_in_range(
        tokens[-1:], "tokens", 1, gen.first_value - 1, "a key (the query, last)", path, number, [len(tokens) - 1]
    )
    return [len(tokens) - 1]


#: The JSON Lines inputs of the generated sequence tasks (``data/generate/sequences.py`` has their layouts).
SEQUENCE_LAYOUTS: dict[str, SequenceLayout] = {
    "selective-copying": SequenceLayout(
        ("id", "tokens", "answers"), _copying_scored, lambda g: (1, g.vocab_size - 2, "a data token")
    ),
    "induction-heads": SequenceLayout(
        ("id", "tokens", "answers"), _induction_scored, lambda g: (0, g.vocab_size - 2, "a data token")
    ),
    "mqar": SequenceLayout(
        ("id", "tokens", "answers", "queries"), _mqar_scored, lambda g: (g.first_value, g.vocab_size - 1, "a value")
    ),
    "associative-recall": SequenceLayout(
        ("id", "tokens", "answers"),
        _recall_scored,
        lambda g: (g.first_value, g.vocab_size - 1, "a value"),
        classify=True,
    ),
}


def read_sequence_inputs(
    task: str, path: Path, vocab: Vocabulary | None, spec: TaskSpec, **options: Any
) -> list[InputRecord]:
    """Inputs of a generated sequence task: JSON Lines, each line ``{"id": ..., "tokens": [...]}`` in
    the task's tokens ``0 .. vocab_size - 1`` (at most ``seq_len`` of them), ``"answers"`` (one per
    scored position) where labelled, and for MQAR ``"queries"`` (the positions of the queries, needed
    with random filler). Predictions are the task's tokens at the positions it scores (the markers,
    the last position, the queries), or the value of the query (associative recall)."""
    from longrange.data.batch import IGNORE_INDEX
    from longrange.data.synthetic import generator_of
    from longrange.typed import did_you_mean

    vocab = _need_vocab(vocab, task)
    layout = SEQUENCE_LAYOUTS[task]
    gen = generator_of(task, options)
    size = gen.vocab_size
    if len(vocab) != size + FIRST_ID:
        raise ConfigError(
            f"the run's vocabulary has {len(vocab)} ids, not the {size + FIRST_ID} of task {task} at vocab_size={size}"
        )
    low, high, words = layout.answers(gen)
    # the option that sets the longest input: the held-out length of the state-tracking tasks
    length_option = "eval_max_len" if hasattr(gen, "eval_max_len") else "seq_len"

    def named(idx: int) -> Any:
        """A vocabulary id as the task's token (an integer), or a special's name."""
        token = vocab.id_to_token(int(idx))
        return int(token) if idx >= FIRST_ID else token

    records, seen = [], {}
    for number, obj in json_lines(path):
        unknown = sorted(set(obj) - set(layout.fields))
        if unknown:
            raise DataFormatError(
                f"unknown field '{unknown[0]}'{did_you_mean(unknown[0], layout.fields, quote=True)}; "
                f"the inputs of {task} have the fields {', '.join(layout.fields)}",
                path,
                number,
            )
        rid = record_id(obj, seen, path, number)
        tokens = int_list(obj, "tokens", path, number, required=True)
        if not tokens:
            raise DataFormatError("field 'tokens' is empty", path, number)
        if len(tokens) > spec.seq_len:
            raise DataFormatError(
                f"field 'tokens': {len(tokens)} tokens, more than the task's seq_len {spec.seq_len} "
                f"(a longer input: --task-option {length_option}=N)",
                path,
                number,
            )
        check_in_range(
            tokens,
            "tokens",
            0,
            size - 1,
            f"a token of the task (vocab_size {size})",
            path,
            number,
            list(range(len(tokens))),
        )
        positions = layout.scored(tokens, obj, gen, path, number)
        item: dict[str, Any] = {"inputs": _tokens(vocab.encode([str(t) for t in tokens], path=path, line=number))}
        answers = int_list(obj, "answers", path, number)
        if answers is not None:
            if len(answers) != len(positions):
                what = "the query" if layout.classify else f"each scored position ({_shown(positions)})"
                raise DataFormatError(
                    f"field 'answers' has {len(answers)} answers; the input asks {len(positions)}, one for {what}",
                    path,
                    number,
                )
            check_in_range(answers, "answers", low, high, words, path, number, positions)
            if layout.classify:
                item["target"] = torch.tensor(answers[0] - gen.first_value)
            else:
                target = torch.full((len(tokens),), IGNORE_INDEX, dtype=torch.long)
                target[positions] = torch.tensor(vocab.encode([str(a) for a in answers], path=path, line=number))
                item["target"] = target
        if layout.classify:
            records.append(InputRecord(rid, item, name_class=lambda c, first=gen.first_value: int(c) + first))
        else:
            records.append(InputRecord(rid, item, positions=positions, name_class=named))
    return records


# ----------------------------------------------------------------------------------- pixel tasks
def read_image_inputs(
    task: str, path: Path, vocab: Vocabulary | None, spec: TaskSpec, **options: Any
) -> list[InputRecord]:
    """One PNG image, or every ``.png`` under a folder in name order (ids: the paths under the
    folder), preprocessed as the task's loader does: Pathfinder grayscale of the task's resolution;
    CIFAR 32x32 colour images, made grayscale by LRA's formula for ``image`` and ``image-numeric``."""
    import numpy as np

    from longrange.data import image as I
    from longrange.data.pathfinder import NUMERIC_MEAN, NUMERIC_STD, decode_png

    files = [path] if path.is_file() else sorted(path.rglob("*.png"))
    if not files:
        raise DataMissingError(f"no .png images in {path}")
    side = int(round(spec.seq_len**0.5))
    pixels = []
    for f in files:
        if task in I._VARIANTS:
            rgb = _decode_rgb(f, side)
            pixels.append(rgb if task == "scifar" else I.rgb_to_gray_lra(rgb)[..., None])
        else:
            pixels.append(decode_png(f, side).reshape(-1, 1))
    store = torch.from_numpy(np.stack(pixels))
    if task == "scifar":
        mean, std = [255.0 * m for m in I.RGB_MEAN], [255.0 * s for s in I.RGB_STD]
    elif task == "image-numeric":
        mean, std = [I.GRAY_MEAN], [I.GRAY_STD]
    else:  # pathfinder's numeric inputs; token inputs ignore these
        mean, std = [NUMERIC_MEAN], [NUMERIC_STD]
    data = I.PixelDataset(
        store,
        torch.zeros(len(files), dtype=torch.long),
        spec.input_kind,
        mean if spec.input_kind == "numeric" else None,
        std if spec.input_kind == "numeric" else None,
    )
    return [
        InputRecord(str(f.relative_to(path)) if f != path else f.name, {"inputs": data[i]["inputs"]})
        for i, f in enumerate(files)
    ]


def _decode_rgb(path: Path, side: int):
    """uint8 (side * side, 3) RGB pixels of a PNG image in raster order."""
    import numpy as np
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            arr = np.asarray(im.convert("RGB"), dtype=np.uint8)
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise DataFormatError(f"unreadable image ({type(exc).__name__}: {exc})", path) from exc
    if arr.shape[:2] != (side, side):
        raise DataFormatError(f"image is {arr.shape[1]}x{arr.shape[0]}, expected {side}x{side}", path)
    return arr.reshape(side * side, 3)


register_input_reader("listops", read_listops_inputs)
register_input_reader("text", read_text_inputs)
register_input_reader("retrieval", read_retrieval_inputs)
for _task in SEQUENCE_LAYOUTS:
    register_input_reader(_task, (lambda t: lambda *args, **kw: read_sequence_inputs(t, *args, **kw))(_task))
for _task in ("pathfinder", "path-x", "path-x-256", "image", "image-numeric", "scifar"):
    register_input_reader(_task, (lambda t: lambda *args, **kw: read_image_inputs(t, *args, **kw))(_task))
