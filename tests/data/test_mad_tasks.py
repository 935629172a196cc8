"""MAD's synthetic tasks (athms/mad-lab mad/data/instances.py): layouts as mad-lab describes them,
reference solvers at 100% on every split, determinism, option errors, levels, readers, and a tiny
model trained a few steps on each."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch

from longrange.data import IGNORE_INDEX, get_spec, list_tasks, load_task
from longrange.data.generate.base import example_rng
from longrange.data.generate.mad import (
    Compression,
    FuzzyInContextRecall,
    InContextRecall,
    Memorization,
    NoisyInContextRecall,
    SelectiveCopying,
)
from longrange.data.inputs import INPUT_READERS, read_inputs
from longrange.data.mad import (
    MAD_GENERATOR_VERSION,
    MAD_LEVELS,
    MAD_TASKS,
    NOT_REGISTERED,
    mad_levels,
)
from longrange.data.synthetic import generator_of, task_vocabulary
from longrange.data.tasks import data_identity
from longrange.data.tokenize import FIRST_TOKEN_ID
from longrange.errors import ConfigError, DataFormatError

SPLITS = dict(n_train=48, n_val=24, n_test=24)
#: Small settings of each task: in-context recall keys 0..5, values 6..11; noisy recall noise 12..19;
#: fuzzy recall keys 0..4, values 5..9, pad 10; selective copying data 0..5, blank 6, copy 7;
#: memorization keys 0..15, values 16..31, insert 32.
SMALL = {
    "mad-in-context-recall": dict(vocab_size=12, seq_len=24),
    "mad-noisy-recall": dict(vocab_size=20, noise_vocab_size=8, frac_noise=0.4, seq_len=24),
    "mad-fuzzy-recall": dict(vocab_size=11, seq_len=40, k_motif_size=2, v_motif_size=2),
    "mad-selective-copying": dict(vocab_size=8, seq_len=24, n_tokens=4),
    "mad-memorization": dict(vocab_size=33, seq_len=16),
    "mad-compression": dict(vocab_size=8, seq_len=12),
}
CLASSES = {
    "mad-in-context-recall": InContextRecall,
    "mad-noisy-recall": NoisyInContextRecall,
    "mad-fuzzy-recall": FuzzyInContextRecall,
    "mad-selective-copying": SelectiveCopying,
    "mad-memorization": Memorization,
    "mad-compression": Compression,
}


def draws(gen, n=150, training=False, seed=0):
    return [gen.draw(example_rng(seed, 11, i), training=training, seed=seed) for i in range(n)]


def asked(ex) -> np.ndarray:
    return np.flatnonzero(ex.targets != IGNORE_INDEX)


# ------------------------------------------------------------------------------------ registration
def test_the_six_tasks_are_registered_with_mads_baseline():
    assert set(MAD_TASKS) <= set(list_tasks()) and not NOT_REGISTERED
    assert set(MAD_TASKS) == set(MAD_LEVELS)
    want = {  # (input length, classes, causal, chance): mad-lab's lengths, 1 / the answers possible
        "mad-in-context-recall": (127, 21, True, 1 / 8),  # 8 keys 0..7, 8 values 8..15
        "mad-fuzzy-recall": (128, 21, True, 1 / 8),  # 15 symbols: keys 0..6, values 7..14, pad 15
        "mad-noisy-recall": (127, 37, True, 1 / 8),  # 32 - 16 noise: keys 0..7, values 8..15
        "mad-selective-copying": (256, 21, False, 1 / 14),  # data 0..13, blank 14, copy 15
        "mad-memorization": (32, 261, False, 1 / 127),  # 127 keys onto values 127..254, insert 255
        "mad-compression": (32, 21, False, 1 / 16),  # 15 data tokens, the compression token 15
    }
    for task, (length, classes, causal, chance) in want.items():
        spec = get_spec(task)
        assert (spec.seq_len, spec.n_classes, spec.causal, spec.per_position) == (length, classes, causal, True)
        assert spec.chance == pytest.approx(chance)
        assert spec.head == ("decode-last" if task == "mad-compression" else None)  # mad-lab's autoencoder
        data = load_task(task)
        n_train = 256 if task == "mad-memorization" else 12800
        assert (len(data.train), len(data.val), len(data.test)) == (n_train, 1280, 1280)
        assert data_identity(task, "/anywhere")["generator"] == f"{task} v{MAD_GENERATOR_VERSION}"
    assert get_spec("mad-in-context-recall", multi_query=False).seq_len == 128  # the copy prefix: seq_len long


def test_levels_are_mads_one_change_at_a_time():
    assert {task: len(levels) for task, levels in MAD_LEVELS.items()} == {
        "mad-in-context-recall": 11,
        "mad-fuzzy-recall": 11,
        "mad-noisy-recall": 14,
        "mad-selective-copying": 13,
        "mad-memorization": 6,
        "mad-compression": 11,
    }
    noisy = mad_levels("mad-noisy-recall")
    assert list(noisy)[:5] == ["baseline", "vocab_size=48", "vocab_size=80", "vocab_size=144", "seq_len=256"]
    assert noisy["frac_noise=0.8"] == {"frac_noise": 0.8} and noisy["n_train=800"] == {"n_train": 800}
    assert mad_levels("mad-selective-copying")["n_tokens=96"] == {"n_tokens": 96}
    for task in MAD_TASKS:  # every level is a valid setting of the task
        for options in mad_levels(task).values():
            get_spec(task, **options)
    assert get_spec("mad-noisy-recall", **noisy["vocab_size=144"]).chance == pytest.approx(1 / 64)
    assert len(load_task("mad-memorization", **mad_levels("mad-memorization")["vocab_size=8192"]).train) == 256
    with pytest.raises(ConfigError, match=r"unknown MAD task 'mad-copying'; known: mad-in-context-recall"):
        mad_levels("mad-copying")


# ------------------------------------------------------------------------------------------ layouts
def test_in_context_recall_layout():
    gen = InContextRecall(vocab_size=12, seq_len=24)
    for ex in draws(gen):
        x, y = ex.inputs, ex.targets
        assert x.shape == y.shape == (23,)  # mad-lab's inputs[:-1]: seq_len - 1 tokens
        keys, values = x[0::2], x[1::2]
        assert ((0 <= keys) & (keys <= 5)).all() and ((6 <= values) & (values <= 11)).all()
        first = {}
        for k, v in zip(keys, values):
            assert first.setdefault(k, v) == v  # a key keeps its value
        want = [2 * i for i, k in enumerate(keys) if k in keys[:i]]  # each key shown before: asked there
        assert asked(ex).tolist() == want and want[-1] == 22  # the last key is always one shown before
        assert all(y[i] == first[x[i]] for i in want)
        assert ex.recalled.tolist() == [i - 1 in want for i in range(23)]  # the values recalled in the input


def test_in_context_recall_training_targets_are_every_next_token():
    gen = InContextRecall(vocab_size=12, seq_len=24)
    for held_out, train in zip(draws(gen, 40), draws(gen, 40, training=True)):
        assert (train.inputs == held_out.inputs).all()  # the same instance, mad-lab's training targets
        assert (train.targets[:-1] == train.inputs[1:]).all() and train.targets[-1] == held_out.targets[-1]
    answers_only = InContextRecall(vocab_size=12, seq_len=24, train_targets="answers")
    for a, b in zip(draws(gen, 20), draws(answers_only, 20, training=True)):
        assert (a.targets == b.targets).all()


def test_single_query_recall_asks_after_the_copy_prefix():
    gen = InContextRecall(vocab_size=12, seq_len=24, multi_query=False)  # copy prefix 11: keys 0..4, values 5..10
    for ex in draws(gen):
        x = ex.inputs
        assert x.shape == (24,) and x[-2] == 11 and (x[:-2][0::2] <= 4).all() and (x[:-2][1::2] >= 5).all()
        assert asked(ex).tolist() == [23] and ex.targets[23] == x[1:-2:2][list(x[0:-2:2]).index(x[-1])]


def test_noisy_recall_layout():
    gen = NoisyInContextRecall(vocab_size=20, noise_vocab_size=8, frac_noise=0.4, seq_len=24)
    noise_pairs = pairs = 0
    for ex in draws(gen, 400):
        body = ex.inputs[:-1].reshape(-1, 2)  # the pairs before the query
        noisy = body[:, 0] >= 12
        assert ((body[noisy] >= 12) & (body[noisy] <= 19)).all()  # two noise tokens 12..19
        assert (body[~noisy, 0] <= 5).all() and ((6 <= body[~noisy, 1]) & (body[~noisy, 1] <= 11)).all()
        assert (~noisy).any()  # at least one key-value pair
        assert not (ex.targets[::2][:-1][noisy] != IGNORE_INDEX).any()  # nothing asked at noise
        noise_pairs, pairs = noise_pairs + noisy.sum(), pairs + len(noisy)
    assert abs(noise_pairs / pairs - 0.4) < 0.03
    assert NoisyInContextRecall().options() == dict(
        vocab_size=32, seq_len=128, multi_query=True, noise_vocab_size=16, frac_noise=0.2, train_targets="next-token"
    )


def test_fuzzy_recall_layout():
    gen = FuzzyInContextRecall(vocab_size=11, seq_len=40, k_motif_size=2, v_motif_size=2)
    sizes = {True: set(), False: set()}
    for training in (False, True):
        for ex in draws(gen, 150, training=training):
            x, y = ex.inputs, ex.targets
            assert x.shape == y.shape == (40,)
            pads = int(np.argmax(x != 10))
            assert pads >= 1 and (x[pads:] != 10).all()  # padded at the front (mad-lab pads to seq_len + 1)
            runs = gen._pairs(x)
            assert sum(end - start for start, end, _, _ in runs) + pads + sum(v - e for _, e, _, v in runs) == 40
            for start, end, key, value_end in runs:
                assert len(set(key)) == len(key) and (x[end:value_end] >= 5).all()  # distinct tokens in a motif
                sizes[training].add(end - start)
                if value_end < 40:
                    assert 1 <= value_end - end <= 2
            where = asked(ex)
            last_end = runs[-1][1]
            assert where[-1] == 39 and last_end - 1 in where  # the final key's value, always recallable
            assert any(key == runs[-1][2] for _, _, key, _ in runs[:-1])
            if training:
                assert (y[:-1] == x[1:]).all()  # every next token
            else:
                assert (y[where[:-1]] == x[where[:-1] + 1]).all()  # next-token answers
    assert sizes[False] == {2} and sizes[True] == {1, 2}  # held-out keys at k_motif_size, training keys 1..k


def test_selective_copying_layout():
    gen = SelectiveCopying(vocab_size=8, seq_len=24, n_tokens=4)
    gaps = np.zeros(4)
    for ex in draws(gen, 300):
        x, y = ex.inputs, ex.targets
        assert x.shape == y.shape == (24,)
        assert x[19] == 7 and (x[20:] == 6).all() and (x[:19] != 7).all()  # copy token, then blanks
        data = x[:19][x[:19] != 6]
        assert len(data) == 4 and (data <= 5).all() and x[18] != 6  # mad-lab never inserts after the last
        assert (y[:20] == IGNORE_INDEX).all() and (y[20:] == data).all()
        gaps += np.diff(np.concatenate([[-1], np.flatnonzero(x[:19] != 6)])) - 1
    assert np.abs(gaps / (300 * 15 / 4) - 1).max() < 0.15  # each blank before a uniform data token (np.insert)


MAD_MAP_AT_12345 = {120: 175, 0: 239, 101: 249}  # mad-lab's generate_kv_map(255, seed=12345), first pairs


def test_memorization_layout_and_mads_map():
    baseline = Memorization()
    table = baseline.table(12345)
    assert len(table) == 127 and sorted(table) == sorted(set(table)) and table.min() >= 127 and table.max() <= 254
    assert {k: int(table[k]) for k in MAD_MAP_AT_12345} == MAD_MAP_AT_12345
    assert not np.array_equal(baseline.table(0), table)  # another data seed, another map
    gen = Memorization(vocab_size=33, seq_len=16)
    for ex in draws(gen, 50, seed=3):
        x, y = ex.inputs, ex.targets
        assert x.shape == y.shape == (16,) and (x[1::2] == 32).all() and (x[0::2] <= 15).all()
        assert (y[0::2] == IGNORE_INDEX).all() and (y[1::2] == gen.table(3)[x[0::2]]).all()


def test_compression_generator_layout():
    gen = Compression(vocab_size=8, seq_len=10)
    for ex in draws(gen, 50):
        assert ex.inputs.shape == (10,) and ex.inputs[-1] == 7 and (ex.inputs[:-1] <= 6).all()
        assert (ex.targets == ex.inputs).all()  # mad-lab returns (inputs, inputs)
        where, answers = gen.solve(ex.inputs)
        assert (answers[where] == ex.targets).all()
    assert Compression.head == "decode-last"


# ------------------------------------------------------------------------------- reference solvers
RECALL = [task for task in sorted(SMALL) if "train_targets" in CLASSES[task].defaults()]


@pytest.mark.parametrize(
    "task, train_targets", [(task, "answers") for task in sorted(SMALL)] + [(task, "next-token") for task in RECALL]
)
def test_reference_solver_scores_100_percent_on_every_split(task, train_targets):
    """The recall tasks train on every next token (mad-lab's) or on the answers alone; the others
    have one kind of target."""
    options = {**SMALL[task], **SPLITS}
    if task in RECALL:
        options["train_targets"] = train_targets
    seed = 4
    data = load_task(task, seed=seed, **options)
    gen = data.train.generator
    for split in ("train", "val", "test"):
        ds = getattr(data, split)
        for i in range(len(ds)):
            item = ds[i]
            x = item["inputs"].numpy() - FIRST_TOKEN_ID
            target = item["target"].numpy()
            where, answers = gen.solve(x, seed=seed)
            if split == "train" and train_targets == "next-token":  # every next token: the answers among them
                assert (target[:-1] == item["inputs"].numpy()[1:]).all()
                assert (target[where] - FIRST_TOKEN_ID == answers).all(), (split, i)
            else:
                assert (np.flatnonzero(target != IGNORE_INDEX) == where).all(), (split, i)
                assert (target[where] - FIRST_TOKEN_ID == answers).all(), (split, i)


def test_the_memorization_solver_needs_the_map_of_the_data_seed():
    data = load_task("mad-memorization", seed=1, **SMALL["mad-memorization"], **SPLITS)
    gen = data.train.generator
    x = data.test[0]["inputs"].numpy() - FIRST_TOKEN_ID
    y = data.test[0]["target"].numpy()
    where, right = gen.solve(x, seed=1)
    assert (y[where] - FIRST_TOKEN_ID == right).all()
    assert not (gen.solve(x, seed=2)[1] == right).all()


# ----------------------------------------------------------------------------------- determinism
def _digest(ds) -> str:
    return hashlib.sha256(
        b"".join(ds[i]["inputs"].numpy().tobytes() + ds[i]["target"].numpy().tobytes() for i in range(len(ds)))
    ).hexdigest()


@pytest.mark.parametrize("task", sorted(SMALL))
def test_same_seed_same_data_other_seed_other_data(task):
    options = {**SMALL[task], **SPLITS}
    first = load_task(task, seed=7, **options)
    alone = {s: _digest(getattr(first, s)) for s in ("train", "val", "test")}
    again = load_task(task, seed=7, **options)
    assert {s: _digest(getattr(again, s)) for s in ("test", "val", "train")} == alone
    assert len(set(alone.values())) == 3  # the splits are different draws
    other = load_task(task, seed=8, **options)
    assert all(_digest(getattr(other, s)) != alone[s] for s in alone)


def test_fresh_training_data_when_asked():
    data = load_task("mad-selective-copying", **SMALL["mad-selective-copying"], **SPLITS, fresh_train=True)
    first = data.train[0]["inputs"]
    data.train.set_epoch(1)
    assert not torch.equal(first, data.train[0]["inputs"])
    fixed = load_task("mad-selective-copying", **SMALL["mad-selective-copying"], **SPLITS)  # MAD's fixed data
    fixed.train.set_epoch(1)
    assert torch.equal(first, fixed.train[0]["inputs"])


# --------------------------------------------------------------------------------------- options
@pytest.mark.parametrize(
    "task, options, message",
    [
        ("mad-in-context-recall", dict(seq_len=25), r"mad-in-context-recall option seq_len must be even"),
        ("mad-in-context-recall", dict(seq_len=2), r"seq_len must be an integer >= 4 \(an even length"),
        (
            "mad-in-context-recall",
            dict(vocab_size=1),
            r"vocab_size must be an integer >= 2 \(at least one key and one value",
        ),
        (
            "mad-in-context-recall",
            dict(multi_query=False, vocab_size=2),
            r"vocab_size must be an integer >= 3 .*and the copy prefix\), got 2",
        ),
        (
            "mad-in-context-recall",
            dict(frac_noise=0.2),
            r"frac_noise=0.2 needs noise tokens: set noise_vocab_size >= 1",
        ),
        (
            "mad-in-context-recall",
            dict(train_targets="all"),
            r"train_targets must be one of 'next-token', 'answers', got 'all'",
        ),
        (
            "mad-noisy-recall",
            dict(frac_noise=1.0),
            r"mad-noisy-recall option frac_noise must be a number in \[0, 1\), got 1.0",
        ),
        (
            "mad-noisy-recall",
            dict(vocab_size=17),
            r"vocab_size must be an integer >= 18 \(at least one key and one value besides 16 noise tokens\), got 17",
        ),
        ("mad-noisy-recall", dict(noise_vocab_size=-1), r"noise_vocab_size must be an integer >= 0, got -1"),
        ("mad-fuzzy-recall", dict(k_motif_size=0), r"mad-fuzzy-recall option k_motif_size must be an integer >= 1"),
        ("mad-fuzzy-recall", dict(vocab_size=6), r"vocab_size must be an integer >= 7 \(3 distinct key tokens"),
        ("mad-fuzzy-recall", dict(seq_len=12), r"seq_len must be an integer >= 13 \(a probe pair of up to 6 tokens"),
        ("mad-fuzzy-recall", dict(multi_query="no"), r"multi_query must be true or false"),
        ("mad-selective-copying", dict(n_tokens=16, seq_len=33), r"seq_len must be an integer >= 34 \(16 data tokens"),
        (
            "mad-selective-copying",
            dict(vocab_size=2),
            r"vocab_size must be an integer >= 3 \(the blank, the copy token",
        ),
        ("mad-memorization", dict(seq_len=31), r"mad-memorization option seq_len must be even"),
        ("mad-memorization", dict(vocab_size=2), r"vocab_size must be an integer >= 3 \(the insert token"),
        ("mad-memorization", dict(n_train=0), r"mad-memorization option n_train must be an integer >= 1"),
        ("mad-selective-copying", dict(seq_len=256.0), r"seq_len must be an integer >= 34 .*, got 256.0"),
    ],
)
def test_option_errors_name_the_option_and_its_range(task, options, message):
    with pytest.raises(ConfigError, match=message):
        get_spec(task, **options)
    with pytest.raises(ConfigError, match=message):
        load_task(task, **options)


def test_unknown_option_names_the_options():
    with pytest.raises(ConfigError, match=r"unknown option 'num_tokens_to_copy'.*n_tokens"):
        load_task("mad-selective-copying", num_tokens_to_copy=16)


# ---------------------------------------------------------------------------------- new inputs
@pytest.mark.parametrize("task", sorted(SMALL))
def test_predict_reads_json_lines_and_scores_the_held_out_positions(task, tmp_path):
    options = {**SMALL[task], **SPLITS}
    assert task in INPUT_READERS.names()
    gen = generator_of(task, options)
    drawn = draws(gen, 4, seed=0)
    path = tmp_path / "new.jsonl"
    path.write_text(
        "".join(
            json.dumps({"id": i, "tokens": ex.inputs.tolist(), "answers": ex.targets[asked(ex)].tolist()}) + "\n"
            for i, ex in enumerate(drawn)
        )
    )
    records = read_inputs(task, path, task_vocabulary(gen.vocab_size), get_spec(task, **options), **options)
    for ex, record in zip(drawn, records):
        assert record.positions == asked(ex).tolist()
        assert torch.equal(record.item["inputs"], torch.from_numpy(ex.inputs + FIRST_TOKEN_ID))
        assert (record.item["target"][record.positions] - FIRST_TOKEN_ID).tolist() == ex.targets[asked(ex)].tolist()


@pytest.mark.parametrize(
    "task, tokens, error",
    [
        ("mad-in-context-recall", [0, 6, 1, 7, 2, 8], r"no key is shown twice"),
        ("mad-in-context-recall", [0, 6, 7, 7, 0], r"position 2: 7 is not a key"),
        ("mad-selective-copying", [0, 6, 1, 6], r"0 copy tokens \(7\)"),
        ("mad-selective-copying", [0, 6, 1, 7, 6], r"2 data tokens before the copy token but 1 positions after it"),
        ("mad-memorization", [3, 4, 5, 6], r"no insert token \(32\)"),
        ("mad-memorization", [3, 32, 20, 32], r"position 3: the insert token does not follow a key \(0..15\)"),
        ("mad-fuzzy-recall", [10, 0, 1, 5, 2, 6], r"no key is shown twice"),
        ("mad-compression", [0, 1, 2, 3], r"expected 12 tokens ending in the compression token 7"),
    ],
)
def test_bad_new_inputs_name_the_line_and_what_is_wrong(task, tokens, error, tmp_path):
    options = {**SMALL[task], **SPLITS}
    gen = generator_of(task, options)
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"id": "a", "tokens": tokens}) + "\n")
    with pytest.raises(DataFormatError, match=r"bad.jsonl, line 1: field 'tokens': " + error):
        read_inputs(task, path, task_vocabulary(gen.vocab_size), get_spec(task, **options), **options)


# ----------------------------------------------------------------------------------- training
def test_a_tiny_model_trains_on_each_task(tmp_path):
    from longrange.experiment.config import experiment_from_dict
    from longrange.experiment.execute import run_stage
    from longrange.experiment.stage import resolve_stage

    for task, options in SMALL.items():
        exp = {
            "label": task,
            "task": {"name": task, "options": {**options, "n_train": 16, "n_val": 8, "n_test": 8}},
            "model": dict(block="simple", primitive="s4d", n_layers=1, d_model=8, d_state=4, direction="causal"),
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
        summary = run_stage(resolve_stage(experiment_from_dict(exp), "train"), tmp_path / task)
        assert summary["steps"] == 3 and summary["metric"] == "accuracy"
        assert 0.0 <= summary["test"]["accuracy"] <= 1.0 and "sequence_accuracy" in summary["test"]
        assert (tmp_path / task / "summary.json").is_file()
