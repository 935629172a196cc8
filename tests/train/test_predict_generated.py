"""``longrange predict`` for every generated task: the sequence tasks' JSON Lines inputs (the
positions each task scores, predictions and answers in the task's own tokens, errors naming the
line and field), Pathfinder's and CIFAR's PNG images, and for every registered task either a
reader or a plain reason why there is none."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from longrange.cli import main
from longrange.data.batch import IGNORE_INDEX
from longrange.data.inputs import INPUT_READERS, NO_READER, SEQUENCE_LAYOUTS, read_inputs, read_sequence_inputs
from longrange.data.synthetic import generator_of
from longrange.data.tasks import get_spec, list_tasks
from longrange.data.tokenize import FIRST_TOKEN_ID, SPECIALS
from longrange.errors import ConfigError, DataFormatError
from longrange.experiment.config import experiment_from_dict
from longrange.experiment.execute import run_stage
from longrange.experiment.stage import resolve_stage
from longrange.train.trained import load_run

SMALL = {"n_train": 16, "n_val": 8, "n_test": 8}
#: A tiny setting of each generated sequence task, and the direction its model needs.
SEQUENCE_TASKS = {
    "selective-copying": (dict(vocab_size=8, seq_len=16, n_tokens=3, **SMALL), "bidirectional"),
    "induction-heads": (dict(vocab_size=8, seq_len=12, **SMALL), "causal"),
    "mqar": (dict(vocab_size=16, seq_len=16, n_pairs=2, **SMALL), "causal"),
    "associative-recall": (dict(vocab_size=16, seq_len=10, n_pairs=2, n_recalls=1, **SMALL), "causal"),
}


def tiny(task: str, options: dict, direction: str, data_dir=None) -> dict:
    exp = {
        "label": task,
        "task": {"name": task, "options": options},
        "model": dict(
            block="simple", primitive="s4d", n_layers=1, d_model=8, d_state=4, direction=direction, pooling="last"
        ),
        "train": {
            "batch_size": 8,
            "eval_batch_size": 8,
            "max_steps": 3,
            "lr": 0.003,
            "progress": False,
            "log_every": 3,
            "eval_every": 3,
        },
    }
    if data_dir is not None:
        exp["task"]["data_dir"] = str(data_dir)
    return exp


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One tiny finished run per generated sequence task (a few steps: predictions, not accuracy, are tested)."""
    root = tmp_path_factory.mktemp("generated-runs")
    for task, (options, direction) in SEQUENCE_TASKS.items():
        run_stage(resolve_stage(experiment_from_dict(tiny(task, options, direction)), "train"), root / task)
    return root


def examples(task: str, options: dict, n: int = 5, seed: int = 7) -> list:
    gen = generator_of(task, options)
    rng = np.random.default_rng(seed)
    return [gen.draw(rng) for _ in range(n)]


def answers_of(ex, gen) -> list[int]:
    """The example's answers in task tokens, one per position it asks."""
    if ex.label is not None:
        return [ex.label + gen.first_value]
    return ex.targets[ex.targets != IGNORE_INDEX].tolist()


def token(idx: int):
    """A vocabulary id as the task's token (an integer), or a special's name (an untrained model may predict one)."""
    return idx - FIRST_TOKEN_ID if idx >= FIRST_TOKEN_ID else SPECIALS[idx]


def write_jsonl(path, objects) -> str:
    path.write_text("".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objects))
    return str(path)


@pytest.mark.parametrize("task", sorted(SEQUENCE_TASKS))
def test_predict_reads_the_tasks_tokens_and_answers_at_the_positions_it_scores(runs, task, tmp_path):
    run = load_run(runs / task, device="cpu")
    options = run.options()
    gen = generator_of(task, options)
    drawn = examples(task, options)
    labelled = write_jsonl(
        tmp_path / "new.jsonl",
        [{"id": f"q{i}", "tokens": ex.inputs.tolist(), "answers": answers_of(ex, gen)} for i, ex in enumerate(drawn)],
    )
    records = run.read_inputs(labelled)
    assert [r.id for r in records] == [f"q{i}" for i in range(len(drawn))]
    predictions = run.predict(records)
    for ex, record, p in zip(drawn, records, predictions):
        assert torch.equal(record.item["inputs"], torch.from_numpy(ex.inputs + FIRST_TOKEN_ID))  # the loader's ids
        with torch.no_grad():  # one sequence at a time, no padding
            out = run.model(record.item["inputs"][None])[0]
        if ex.label is not None:  # associative recall: a class, written as the value it names
            assert p.positions is None
            assert p.value == int(out.argmax(-1)) + gen.first_value
            assert p.target == ex.label + gen.first_value
        else:  # the positions the generator asks at: derived from the tokens alone
            asked = np.flatnonzero(ex.targets != IGNORE_INDEX).tolist()
            assert p.positions == asked
            assert p.value == [token(int(out[i].argmax())) for i in asked]
            assert p.target == answers_of(ex, gen)

    # the same inputs without answers: the same predictions, no target
    bare = write_jsonl(
        tmp_path / "bare.jsonl", [{"id": f"q{i}", "tokens": ex.inputs.tolist()} for i, ex in enumerate(drawn)]
    )
    again = run.predict(run.read_inputs(bare))
    assert [p.value for p in again] == [p.value for p in predictions] and all(p.target is None for p in again)

    out_file = tmp_path / "predictions.tsv"
    assert main(["predict", str(runs / task), "--input", labelled, "--output", str(out_file), "--device", "cpu"]) == 0
    lines = out_file.read_text().splitlines()
    if task == "associative-recall":
        assert lines[0] == "id\tprediction\ttarget"
        assert lines[1:] == [f"{p.id}\t{p.value}\t{p.target}" for p in predictions]
    else:
        assert lines[0] == "id\tpositions\tprediction\ttarget"
        assert lines[1:] == [
            "\t".join(
                [p.id, " ".join(map(str, p.positions)), " ".join(map(str, p.value)), " ".join(map(str, p.target))]
            )
            for p in predictions
        ]


def test_the_labelled_note_counts_answers(runs, tmp_path, capsys):
    task = "mqar"
    run = load_run(runs / task, device="cpu")
    gen = generator_of(task, run.options())
    drawn = examples(task, run.options(), n=3)
    path = write_jsonl(
        tmp_path / "in.jsonl",
        [{"id": i, "tokens": ex.inputs.tolist(), "answers": answers_of(ex, gen)} for i, ex in enumerate(drawn)],
    )
    assert main(["predict", str(runs / task), "--input", path, "--device", "cpu"]) == 0
    captured = capsys.readouterr()
    predictions = run.predict(run.read_inputs(path))
    right = sum(v == t for p in predictions for v, t in zip(p.value, p.target))
    total = sum(len(p.positions) for p in predictions)
    assert f"3 predictions of {runs / task}" in captured.err
    assert f"{right} of {total} labelled answers right" in captured.err
    assert captured.out.splitlines()[1].startswith("0\t")  # integer ids are written as text


def test_mqar_queries_given_or_required_with_random_filler(runs, tmp_path):
    run = load_run(runs / "mqar", device="cpu")
    ex = examples("mqar", run.options(), n=1)[0]
    asked = np.flatnonzero(ex.targets != IGNORE_INDEX).tolist()
    given = write_jsonl(tmp_path / "q.jsonl", [{"id": "a", "tokens": ex.inputs.tolist(), "queries": asked[::-1]}])
    assert run.read_inputs(given)[0].positions == asked
    options = {**run.options(), "random_filler": True}
    write_jsonl(tmp_path / "bare.jsonl", [{"id": "a", "tokens": ex.inputs.tolist()}])
    with pytest.raises(DataFormatError, match=r"bare.jsonl, line 1: missing field 'queries'.*random_filler=true"):
        read_sequence_inputs("mqar", tmp_path / "bare.jsonl", run.vocab, get_spec("mqar", **options), **options)
    assert (
        read_sequence_inputs("mqar", tmp_path / "q.jsonl", run.vocab, get_spec("mqar", **options), **options)[
            0
        ].positions
        == asked
    )


BAD_INPUTS = [  # (task, the line, the error it gives)
    ("associative-recall", '{"tokens": [1, 9, 2, 10, 0, 0, 0, 0, 0, 1]}', r"line 2: missing field 'id'"),
    (
        "associative-recall",
        '{"id": "a", "tokens": [1, 9, 2, 10, 0, 0, 0, 0, 0, 1]}',
        r"line 2: field 'id': 'a' is also the id of line 1",
    ),
    (
        "associative-recall",
        '{"id": "", "tokens": [1, 9]}',
        r"line 2: field 'id' must be a non-empty string or an integer",
    ),
    ("associative-recall", '{"id": "b"}', r"line 2: missing field 'tokens'"),
    ("associative-recall", '{"id": "b", "tokens": "1 9 2"}', r"line 2: field 'tokens' must be a list of integers"),
    (
        "associative-recall",
        '{"id": "b", "tokens": [1, 9, 2, 10, 0, 16, 0, 0, 0, 1]}',
        r"line 2: field 'tokens', position 5: 16 is not a token of the task \(vocab_size 16\) \(0..15\)",
    ),
    (
        "associative-recall",
        '{"id": "b", "tokens": [1, 9, 2, 10, 0, 0, 0, 0, 0, 0, 0, 1]}',
        r"line 2: field 'tokens': 12 tokens, more than the task's seq_len 10 \(a longer input: --task-option seq_len=N\)",
    ),
    (
        "associative-recall",
        '{"id": "b", "tokens": [1, 9, 2, 10, 0, 0, 0, 0, 0, 9]}',
        r"line 2: field 'tokens', position 9: 9 is not a key \(the query, last\) \(1..7\)",
    ),
    (
        "associative-recall",
        '{"id": "b", "tokens": [1, 9, 2, 10, 0, 0, 0, 0, 0, 1], "answers": [3]}',
        r"line 2: field 'answers', position 9: 3 is not a value \(8..15\)",
    ),
    (
        "associative-recall",
        '{"id": "b", "tokens": [1, 9, 2, 10, 0, 0, 0, 0, 0, 1], "answer": [9]}',
        r"line 2: unknown field 'answer' \(did you mean 'answers'\?\)",
    ),
    ("associative-recall", '{"id": "b", "tokens": [1, 9, 2, 10, 0, 0, 0, 0, 0, 1]', r"line 2: not valid JSON"),
    ("associative-recall", "[1, 9, 2]", r"line 2: expected a JSON object"),
    ("selective-copying", '{"id": "b", "tokens": [0, 3, 0, 4]}', r"line 2: field 'tokens' holds no marker \(7\)"),
    (
        "selective-copying",
        '{"id": "b", "tokens": [0, 3, 0, 7], "answers": [3, 4]}',
        r"line 2: field 'answers' has 2 answers; the input asks 1",
    ),
    ("induction-heads", '{"id": "b", "tokens": [7, 3, 0, 4]}', r"line 2: field 'tokens' ends in 4, not the trigger 7"),
    ("mqar", '{"id": "b", "tokens": [1, 9, 2, 10, 0, 0, 0]}', r"line 2: field 'tokens' holds no query"),
    ("mqar", '{"id": "b", "tokens": [1, 3, 2, 10, 1, 0, 0]}', r"line 2: field 'tokens', position 1: 3 is not a value"),
    (
        "mqar",
        '{"id": "b", "tokens": [1, 9, 2, 10, 1, 0, 0], "queries": [5]}',
        r"line 2: field 'tokens', position 5: 0 is not a key \(a query\)",
    ),
]


@pytest.mark.parametrize("task, line, error", BAD_INPUTS)
def test_bad_inputs_are_errors_naming_the_line_and_field(runs, tmp_path, task, line, error):
    first = {
        "associative-recall": '{"id": "a", "tokens": [1, 9, 2, 10, 0, 0, 0, 0, 0, 1]}',
        "selective-copying": '{"id": "a", "tokens": [0, 3, 0, 7]}',
        "induction-heads": '{"id": "a", "tokens": [7, 3, 0, 7]}',
        "mqar": '{"id": "a", "tokens": [1, 9, 2, 10, 1, 0, 2]}',
    }[task]
    path = write_jsonl(tmp_path / "bad.jsonl", [first, line])
    run = load_run(runs / task, device="cpu")
    assert len(run.read_inputs(write_jsonl(tmp_path / "good.jsonl", [first]))) == 1
    with pytest.raises(DataFormatError, match=r"bad.jsonl, " + error):
        run.read_inputs(path)


def test_the_command_reports_a_bad_line_without_a_traceback(runs, tmp_path, capsys):
    path = write_jsonl(tmp_path / "bad.jsonl", ['{"id": "a", "tokens": [0, 3, 0, 9]}'])
    assert main(["predict", str(runs / "selective-copying"), "--input", path, "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert "bad.jsonl, line 1: field 'tokens', position 3: 9 is not a token of the task (vocab_size 8)" in err
    assert "Traceback" not in err


def test_every_registered_task_predicts_or_says_why_not(tmp_path):
    """Iterate over the task registry: each task has a reader of new inputs, or predict names the
    task and says plainly why it has none (and what to do instead)."""
    new_file = tmp_path / "new.txt"
    new_file.write_text("anything\n")
    tasks = list_tasks()
    assert set(SEQUENCE_LAYOUTS) | {"listops", "pathfinder", "path-x", "path-x-256", "image"} <= set(
        INPUT_READERS.names()
    )
    for task in tasks:
        if task in INPUT_READERS.names():
            continue
        assert task in NO_READER, f"task {task} has neither a reader of new inputs nor a reason why not"
        with pytest.raises(ConfigError) as caught:
            read_inputs(task, new_file, None, get_spec(task))
        message = str(caught.value)
        assert message.startswith(f"task {task} has no reader of new inputs: {NO_READER[task]}.")
        assert "longrange evaluate" in message and "register_input_reader" in message
    # a task of one's own without a reader: the message says none is registered
    from longrange.data.inputs import no_reader_message

    assert no_reader_message("recent-sum").startswith(
        "task recent-sum has no reader of new inputs: none is registered for it."
    )


def test_pathfinder_images_are_read_as_the_task_reads_them(tmp_path):
    """A generated Pathfinder run predicts on a folder of PNG images; each image's inputs are the
    loader's (token ids of its 256 levels, in raster order)."""
    from longrange.data import load_task
    from longrange.data.generate.pathfinder import generate
    from longrange.data.pathfinder import decode_png

    difficulty = generate(
        tmp_path / "data" / "pathfinder", resolution=16, n_samples=20, contour_length=6, seed=0, quiet=True
    )
    options = {"resolution": 16, "difficulty": 6, "input_kind": "tokens"}
    exp = tiny("pathfinder", options, "bidirectional", tmp_path / "data")
    exp["model"]["pooling"] = "mean"
    run_stage(resolve_stage(experiment_from_dict(exp), "train"), tmp_path / "run")
    run = load_run(tmp_path / "run", device="cpu")
    folder = difficulty / "imgs" / "0"
    records = run.read_inputs(folder)
    files = sorted(folder.rglob("*.png"))
    assert [r.id for r in records] == [str(f.relative_to(folder)) for f in files]
    for f, r in zip(files, records):
        assert torch.equal(r.item["inputs"], torch.from_numpy(decode_png(f, 16).reshape(-1).astype(np.int64)) + 5)
    data = load_task("pathfinder", tmp_path / "data", **options)
    loaded = {tuple(item["inputs"].tolist()) for split in (data.train, data.val, data.test) for item in split}
    assert all(tuple(r.item["inputs"].tolist()) in loaded for r in records)
    predictions = run.predict(records)
    with torch.no_grad():
        assert [p.value for p in predictions] == [int(run.model(r.item["inputs"][None]).argmax(-1)) for r in records]
    assert main(["predict", str(tmp_path / "run"), "--input", str(files[0]), "--device", "cpu"]) == 0


def test_cifar_images_are_preprocessed_as_the_loader_does(tmp_path):
    from PIL import Image

    from longrange.data import image as I

    rgb = np.random.default_rng(0).integers(0, 256, size=(32, 32, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(tmp_path / "cat.png")
    pixels = rgb.reshape(1024, 3)
    gray = I.rgb_to_gray_lra(pixels)
    (tokens,) = read_inputs("image", tmp_path / "cat.png", I.level_vocabulary(), get_spec("image"))
    assert tokens.id == "cat.png" and torch.equal(tokens.item["inputs"], torch.from_numpy(gray.astype(np.int64)) + 5)
    (numeric,) = read_inputs("image-numeric", tmp_path, None, get_spec("image-numeric"))
    torch.testing.assert_close(
        numeric.item["inputs"][:, 0], (torch.from_numpy(gray).float() - I.GRAY_MEAN) / I.GRAY_STD
    )
    (colour,) = read_inputs("scifar", tmp_path, None, get_spec("scifar"))
    want = (torch.from_numpy(pixels).float() - 255.0 * torch.tensor(I.RGB_MEAN)) / (255.0 * torch.tensor(I.RGB_STD))
    torch.testing.assert_close(colour.item["inputs"], want)
    Image.fromarray(rgb[:16]).save(tmp_path / "small.png")
    with pytest.raises(DataFormatError, match=r"small.png: image is 32x16, expected 32x32"):
        read_inputs("image", tmp_path / "small.png", I.level_vocabulary(), get_spec("image"))


def test_the_documented_examples_read_and_their_answers_are_the_solvers(tmp_path):
    """docs/inference.md's JSON Lines example of each generated task, at the options it states: read
    without error, scored where the generator asks, its answers those of the task's reference solver."""
    import re
    from pathlib import Path

    from longrange.data.synthetic import task_vocabulary

    page = (Path(__file__).resolve().parents[2] / "docs" / "inference.md").read_text()
    found = re.findall(r"\*\*([a-z-]+)\*\* \((?:the demo's setting, )?`([^`]*)`.*?```text\n(.*?)```", page, re.S)
    assert sorted(task for task, _, _ in found) == sorted(SEQUENCE_TASKS)
    for task, setting, line in found:
        options = {k: int(v) for k, v in (pair.split("=") for pair in setting.split(":")[0].split())}
        spec = get_spec(task, **options)
        gen = generator_of(task, options)
        path = tmp_path / f"{task}.jsonl"
        path.write_text(line)
        (record,) = read_sequence_inputs(task, path, task_vocabulary(gen.vocab_size), spec, **options)
        obj = json.loads(line)
        inputs = np.array(obj["tokens"])
        if task == "associative-recall":
            assert record.positions is None and gen.solve(inputs) + gen.first_value == obj["answers"][0]
            continue
        if task == "mqar":
            assert gen.solve(inputs, np.array(record.positions)).tolist() == obj["answers"]
        else:
            asked, answers = gen.solve(inputs)
            assert record.positions == asked.tolist() and answers.tolist() == obj["answers"]
        target = record.item["target"]
        assert (target[record.positions] - FIRST_TOKEN_ID).tolist() == obj["answers"]


def test_a_pretraining_run_is_refused_for_a_classification(tmp_path):
    """Associative recall asks one class per input; a causally pretrained model answers at every position."""
    options, direction = SEQUENCE_TASKS["associative-recall"]
    run_stage(
        resolve_stage(experiment_from_dict(tiny("associative-recall", options, direction)), "pretrain"),
        tmp_path / "pre",
    )
    run = load_run(tmp_path / "pre", device="cpu")
    path = write_jsonl(tmp_path / "in.jsonl", ['{"id": "a", "tokens": [1, 9, 2, 10, 0, 0, 0, 0, 0, 1]}'])
    with pytest.raises(
        ConfigError,
        match=r"input a asks for one class, but the model of this run predicts at every "
        r"position \(a pretraining run\?\)",
    ):
        run.predict(run.read_inputs(path))
