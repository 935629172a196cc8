"""The generated sequence tasks: layouts, reference solvers, determinism, options and registration."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from longrange.data import IGNORE_INDEX, get_spec, list_tasks, load_task, task_status
from longrange.data.generate.base import example_rng
from longrange.data.generate.sequences import AssociativeRecall, InductionHeads, MultiQueryAR, SelectiveCopying
from longrange.data.synthetic import GENERATOR_VERSION
from longrange.data.tasks import data_identity
from longrange.data.tokenize import FIRST_TOKEN_ID
from longrange.errors import ConfigError

SRC = Path(__file__).resolve().parents[2] / "src"
#: Small settings of each task (sizes kept tiny: every example is drawn when read).
SMALL = {
    "selective-copying": dict(vocab_size=8, seq_len=40, n_tokens=5, n_train=64, n_val=32, n_test=32),
    "induction-heads": dict(vocab_size=6, seq_len=24, n_train=64, n_val=32, n_test=32),
    "mqar": dict(vocab_size=64, seq_len=48, n_pairs=6, n_train=64, n_val=32, n_test=32),
    "associative-recall": dict(vocab_size=40, seq_len=20, n_pairs=5, n_train=64, n_val=32, n_test=32),
}
GENERATORS = {
    "selective-copying": SelectiveCopying,
    "induction-heads": InductionHeads,
    "mqar": MultiQueryAR,
    "associative-recall": AssociativeRecall,
}


def generator(task: str, **options):
    opts = {
        k: v
        for k, v in {**SMALL[task], **options}.items()
        if not k.startswith("n_") or k == "n_tokens" or k == "n_pairs"
    }
    return GENERATORS[task](**opts)


def draws(gen, n=200, seed=0):
    return [gen.draw(example_rng(seed, 7, i)) for i in range(n)]


# ------------------------------------------------------------------------------------------ layouts
def test_selective_copying_layout():
    gen = generator("selective-copying")  # vocab 8: noise 0, data 1..6, marker 7
    for ex in draws(gen):
        x, y = ex.inputs, ex.targets
        assert x.shape == y.shape == (40,) and x.dtype == y.dtype == np.int64
        assert (x[-5:] == 7).all() and not (x[:-5] == 7).any()  # the markers, last
        data = x[:-5][x[:-5] != 0]
        assert len(data) == 5 and ((1 <= data) & (data <= 6)).all()
        assert (y[:-5] == IGNORE_INDEX).all() and (y[-5:] == data).all()  # in order, at the markers


def test_selective_copying_data_positions_cover_the_noise_region():
    gen = generator("selective-copying")
    seen = np.zeros(40, dtype=int)
    for ex in draws(gen, 400):
        seen[np.flatnonzero((ex.inputs != 0) & (ex.inputs != 7))] += 1
    assert (seen[:35] > 0).all() and (seen[35:] == 0).all()


def test_induction_heads_layout():
    gen = generator("induction-heads")  # vocab 6: data 0..4, trigger 5
    firsts = set()
    for ex in draws(gen):
        x, y = ex.inputs, ex.targets
        triggers = np.flatnonzero(x == 5)
        assert len(triggers) == 2 and triggers[1] == 23 and triggers[0] <= 21
        assert ((0 <= x) & (x <= 5)).all()
        assert (y[:-1] == IGNORE_INDEX).all() and y[-1] == x[triggers[0] + 1] and y[-1] != 5
        firsts.add(int(triggers[0]))
    assert firsts == set(range(22))  # the earlier trigger anywhere in [0, L-3]


def test_mqar_layout():
    gen = generator("mqar")  # keys 1..31, values 32..63, 6 pairs, queries after position 12
    for ex in draws(gen):
        x, y = ex.inputs, ex.targets
        keys, values = x[0:12:2], x[1:12:2]
        assert len(set(keys)) == 6 and ((1 <= keys) & (keys <= 31)).all()
        assert len(set(values)) == 6 and ((32 <= values) & (values <= 63)).all()
        asked = np.flatnonzero(y != IGNORE_INDEX)
        assert len(asked) == 6 and (asked >= 12).all() and (asked % 2 == 0).all()
        assert sorted(x[asked]) == sorted(keys)  # every key queried once
        assert dict(zip(keys, values)) == dict(zip(x[asked], y[asked]))
        rest = np.ones(48, dtype=bool)
        rest[:12] = rest[asked] = False
        assert (x[rest] == 0).all()  # the filler of Zoology's Figure 2 (random_non_queries False)
        assert (y[:12] == IGNORE_INDEX).all()


def test_mqar_random_filler_uses_the_whole_vocabulary():
    gen = generator("mqar", random_filler=True)
    filler = np.concatenate([ex.inputs[12:][ex.targets[12:] == IGNORE_INDEX] for ex in draws(gen, 100)])
    assert filler.min() == 0 and filler.max() == 63 and len(set(filler.tolist())) == 64


def test_mqar_gaps_are_drawn_as_successive_weighted_draws_without_replacement():
    # 6 gaps of probability ∝ a k^(a-1), 2 pairs: gap of the first key ~ p, of the second ~ p_j / (1 - p_i)
    gen = MultiQueryAR(vocab_size=16, seq_len=16, n_pairs=2, power_a=0.5)
    p = gen.gap_probabilities()
    assert len(p) == 6 and np.allclose(p, 0.5 * np.arange(1, 7) ** -0.5 / (0.5 * np.arange(1, 7) ** -0.5).sum())
    n = 20000
    joint = np.zeros((6, 6))
    for i in range(n):
        gaps = gen.gaps(example_rng(3, i))
        joint[gaps[0], gaps[1]] += 1
    expected = p[:, None] * p[None, :] / (1 - p[:, None])
    np.fill_diagonal(expected, 0.0)
    assert np.abs(joint / n - expected).max() < 0.012
    assert np.trace(joint) == 0  # distinct gaps


def test_associative_recall_layout():
    gen = generator("associative-recall")  # keys 1..19, values 20..39: 20 classes
    assert gen.n_classes == 20 and get_spec("associative-recall", **SMALL["associative-recall"]).n_classes == 20
    labels = set()
    for ex in draws(gen):
        x = ex.inputs
        keys, values = x[0:10:2], x[1:10:2]
        assert ex.targets is None and x[-1] in keys and (x[10:-1] == 0).all()
        assert ex.label == values[list(keys).index(x[-1])] - 20
        labels.add(ex.label)
    assert labels <= set(range(20)) and len(labels) > 10


# ------------------------------------------------------------------------------- reference solvers
def _solved(task: str, gen, item) -> bool:
    x = item["inputs"].numpy() - FIRST_TOKEN_ID
    target = item["target"].numpy()
    if task == "associative-recall":
        return gen.solve(x) == int(target)
    asked = np.flatnonzero(target != IGNORE_INDEX)
    y = target[asked] - FIRST_TOKEN_ID
    if task == "mqar":
        return bool((gen.solve(x, asked) == y).all())
    where, answers = gen.solve(x)
    return bool((where == asked).all() and (answers == y).all())


@pytest.mark.parametrize("task", sorted(SMALL))
def test_reference_solver_scores_100_percent_on_every_split(task):
    data = load_task(task, **SMALL[task])
    gen = data.train.generator
    for split in ("train", "val", "test"):
        ds = getattr(data, split)
        assert all(_solved(task, gen, ds[i]) for i in range(len(ds))), split
    data.train.set_epoch(3)  # the fresh training examples of a later epoch too
    assert all(_solved(task, gen, data.train[i]) for i in range(len(data.train)))


@pytest.mark.parametrize("task", sorted(SMALL))
def test_items_are_token_ids_after_the_specials(task):
    data = load_task(task, **SMALL[task])
    vocab_size = SMALL[task]["vocab_size"]
    assert len(data.vocab) == vocab_size + FIRST_TOKEN_ID and data.vocab_size == vocab_size + FIRST_TOKEN_ID
    batch = data.collate([data.train[i] for i in range(8)])
    assert batch["inputs"].dtype == torch.long
    assert batch["inputs"].min() >= FIRST_TOKEN_ID and batch["inputs"].max() < vocab_size + FIRST_TOKEN_ID
    assert (batch["lengths"] == SMALL[task]["seq_len"]).all()
    if data.spec.per_position:
        assert batch["targets"].shape == batch["inputs"].shape
        answers = batch["targets"][batch["targets"] != IGNORE_INDEX]
        assert answers.min() >= FIRST_TOKEN_ID and answers.max() < data.spec.n_classes
    else:
        assert batch["targets"].shape == (8,)


# ----------------------------------------------------------------------------------- determinism
def _digest(task: str, splits=("train", "val", "test"), seed: int = 0, workers: int = 0, **options) -> str:
    data = load_task(task, seed=seed, **{**SMALL[task], **options})
    h = hashlib.sha256()
    for split in splits:
        loader = DataLoader(getattr(data, split), batch_size=16, collate_fn=data.collate, num_workers=workers)
        for batch in loader:
            h.update(batch["inputs"].numpy().tobytes() + batch["targets"].numpy().tobytes())
    return h.hexdigest()


def _split_digest(data, split: str) -> str:
    ds = getattr(data, split)
    return hashlib.sha256(
        b"".join(ds[i]["inputs"].numpy().tobytes() + ds[i]["target"].numpy().tobytes() for i in range(len(ds)))
    ).hexdigest()


@pytest.mark.parametrize("task", sorted(SMALL))
def test_same_seed_same_data_whatever_was_read_before(task):
    alone = {s: _split_digest(load_task(task, **SMALL[task]), s) for s in ("train", "val", "test")}
    data = load_task(task, **SMALL[task])
    in_reverse = {s: _split_digest(data, s) for s in ("test", "val", "train")}
    assert in_reverse == alone
    assert len(set(alone.values())) == 3  # the splits are different draws
    other_seed = load_task(task, seed=1, **SMALL[task])
    assert all(_split_digest(other_seed, s) != alone[s] for s in alone)


def test_same_data_in_data_loader_workers_and_in_another_process():
    here = _digest("mqar")
    assert _digest("mqar", workers=2) == here
    code = "import sys; sys.path.insert(0, 'tests/data'); from test_synthetic import _digest; print(_digest('mqar'))"
    env = {**os.environ, "PYTHONPATH": str(SRC), "PYTHONHASHSEED": "123"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=SRC.parent, env=env
    )
    assert out.stdout.strip() == here


def test_fresh_training_examples_every_epoch_fixed_held_out_sets():
    data = load_task("induction-heads", **SMALL["induction-heads"])  # fresh_train defaults to true here
    first = [data.train[i]["inputs"] for i in range(4)]
    val = [data.val[i]["inputs"] for i in range(4)]
    data.train.set_epoch(1)
    data.val.set_epoch(1)  # held-out splits ignore it
    assert all(not torch.equal(a, data.train[i]["inputs"]) for i, a in enumerate(first))
    assert all(torch.equal(a, data.val[i]["inputs"]) for i, a in enumerate(val))
    data.train.set_epoch(0)
    assert all(torch.equal(a, data.train[i]["inputs"]) for i, a in enumerate(first))
    fixed = load_task("induction-heads", **{**SMALL["induction-heads"], "fresh_train": False})
    fixed.train.set_epoch(5)
    assert all(torch.equal(a, fixed.train[i]["inputs"]) for i, a in enumerate(first))


def test_other_options_other_data_and_nothing_written(tmp_path):
    a = load_task("mqar", tmp_path, **SMALL["mqar"])
    b = load_task("mqar", tmp_path, **{**SMALL["mqar"], "power_a": 1.0})
    assert any(not torch.equal(a.train[i]["target"], b.train[i]["target"]) for i in range(8))
    assert not tmp_path.exists() or not any(tmp_path.iterdir())  # generated when read: no cache to mix up


# --------------------------------------------------------------------------------------- options
@pytest.mark.parametrize(
    "task, options, message",
    [
        (
            "selective-copying",
            dict(n_tokens=21, seq_len=40),
            r"selective-copying option n_tokens must be an integer in \[1, 20\]",
        ),
        (
            "selective-copying",
            dict(vocab_size=2),
            r"vocab_size must be an integer >= 3 \(noise, marker and at least one",
        ),
        ("selective-copying", dict(seq_len=1), r"seq_len must be an integer >= 2, got 1"),
        ("induction-heads", dict(seq_len=2), r"induction-heads option seq_len must be an integer >= 3 .*, got 2"),
        ("induction-heads", dict(vocab_size=1), r"vocab_size must be an integer >= 2"),
        ("mqar", dict(seq_len=20, n_pairs=6), r"mqar option seq_len must be an integer >= 24 .*, got 20"),
        ("mqar", dict(vocab_size=12, n_pairs=6), r"mqar option vocab_size must be an integer >= 14 .*, got 12"),
        ("mqar", dict(n_pairs=0), r"mqar option n_pairs must be an integer >= 1, got 0"),
        ("mqar", dict(power_a=0.0), r"mqar option power_a must be a finite number > 0 .*, got 0.0"),
        ("mqar", dict(random_filler="yes"), r"mqar option random_filler must be true or false"),
        (
            "associative-recall",
            dict(seq_len=10, n_pairs=5),
            r"associative-recall option seq_len must be an integer >= 11",
        ),
        ("associative-recall", dict(n_train=0), r"associative-recall option n_train must be an integer >= 1 .*got 0"),
        ("induction-heads", dict(fresh_train=1), r"induction-heads option fresh_train must be true or false"),
        ("mqar", dict(seq_len=64.0), r"mqar option seq_len must be an integer >= 24 .*, got 64.0"),
    ],
)
def test_option_errors_name_the_option_and_its_range(task, options, message):
    merged = {**SMALL[task], **options}
    with pytest.raises(ConfigError, match=message):
        get_spec(task, **merged)
    with pytest.raises(ConfigError, match=message):
        load_task(task, **merged)


def test_unknown_option_lists_the_options():
    with pytest.raises(ConfigError, match="n_pairs"):
        load_task("mqar", n_pair=4)


# ---------------------------------------------------------------------------------- registration
def test_registered_with_their_defaults_and_identity():
    assert {"selective-copying", "induction-heads", "mqar", "associative-recall"} <= set(list_tasks())
    spec = get_spec("selective-copying")
    assert (spec.seq_len, spec.n_classes, spec.per_position, spec.causal) == (4096, 21, True, False)
    assert (get_spec("induction-heads").seq_len, get_spec("induction-heads").causal) == (256, True)
    assert (get_spec("mqar").seq_len, get_spec("mqar").n_classes, get_spec("mqar").causal) == (64, 8197, True)
    ar = get_spec("associative-recall")
    assert (ar.per_position, ar.n_classes) == (False, 4096)
    present, lines = task_status("mqar", "/nonexistent")
    assert present and "generated" in lines[0]
    identity = data_identity("mqar", "/somewhere")
    assert identity == data_identity("mqar", "/elsewhere")  # no directory is read
    assert identity["generator"] == f"mqar v{GENERATOR_VERSION}"


# ------------------------------------------------------------------------- the generators' shape
@pytest.mark.parametrize(
    "cls, bad, message",
    [
        (SelectiveCopying, dict(n_tokens=0), "selective-copying option n_tokens"),
        (InductionHeads, dict(seq_len=2), "induction-heads option seq_len"),
        (MultiQueryAR, dict(power_a=-1.0), "mqar option power_a"),
        (AssociativeRecall, dict(n_pairs=-2), "associative-recall option n_pairs"),
        ("listops", dict(max_args=1), r"listops generator option max_args must be an integer >= 2, got 1"),
        ("pathfinder", dict(resolution=4), r"pathfinder generator option resolution must be an integer >= 8 \(pixels"),
    ],
)
def test_every_generator_has_one_shape(cls, bad, message):
    import random

    from longrange.data.generate.base import Generator
    from longrange.data.generate.listops import ListOpsTrees
    from longrange.data.generate.pathfinder import Scene, SceneParams

    cls = {"listops": ListOpsTrees, "pathfinder": SceneParams}.get(cls, cls)
    assert issubclass(cls, Generator)
    defaults = cls.defaults()
    assert set(bad) <= set(defaults) and cls().options() == defaults
    with pytest.raises(ConfigError, match=message):
        cls(**bad)
    if cls is ListOpsTrees:
        drawn = ListOpsTrees(min_length=5, max_length=40, max_depth=3, max_args=3).draw(random.Random(0))
        assert drawn is None or 0 < drawn[1] < 40
    elif cls is SceneParams:
        assert isinstance(SceneParams.for_resolution(16, contour_length=6).draw(example_rng(0, 1), 1), Scene)
    else:
        assert cls().draw(example_rng(0, 1)).inputs.shape == (cls().seq_len,)


def test_mqar_answers_in_input_put_each_value_after_its_query():
    plain = MultiQueryAR(vocab_size=32, seq_len=40, n_pairs=4)
    text = MultiQueryAR(vocab_size=32, seq_len=40, n_pairs=4, answers_in_input=True)
    for seed in range(20):
        a, b = plain.draw(np.random.default_rng(seed)), text.draw(np.random.default_rng(seed))
        asked = np.flatnonzero(b.targets != IGNORE_INDEX)
        assert (b.targets == a.targets).all()  # the same questions and answers
        assert (b.inputs[asked + 1] == b.targets[asked]).all()  # each value right after its query
        assert (a.inputs[asked + 1] == 0).all()  # Zoology's inputs: filler there
        other = np.ones(40, dtype=bool)
        other[asked + 1] = False
        assert (a.inputs[other] == b.inputs[other]).all()
        assert (text.solve(b.inputs, asked) == b.targets[asked]).all()


def test_associative_recall_with_recalled_pairs_in_the_input():
    gen = AssociativeRecall(vocab_size=64, seq_len=40, n_pairs=8, n_recalls=3)
    for seed in range(20):
        ex = gen.draw(np.random.default_rng(seed))
        pairs = dict(zip(ex.inputs[0:16:2].tolist(), ex.inputs[1:16:2].tolist()))
        body = ex.inputs[16:-1]
        keys = [int(k) for k in body if 1 <= k < 32]
        assert len(keys) == 3 and len(set(keys)) == 3 and int(ex.inputs[-1]) not in keys
        for k in keys:  # each recalled key is followed by its value
            at = 16 + int(np.flatnonzero(body == k)[0])
            assert (at - 16) % 2 == 0 and ex.inputs[at + 1] == pairs[k]
        assert ex.label == gen.solve(ex.inputs) == pairs[int(ex.inputs[-1])] - 32
    # without recalls the draws are those of the plain layout (the same random stream)
    plain, none = (
        AssociativeRecall(vocab_size=64, seq_len=40, n_pairs=8),
        AssociativeRecall(vocab_size=64, seq_len=40, n_pairs=8, n_recalls=0),
    )
    assert (plain.draw(np.random.default_rng(1)).inputs == none.draw(np.random.default_rng(1)).inputs).all()


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(n_pairs=4, n_recalls=4), r"n_recalls must be an integer in \[0, 3\] \(recalled keys are other keys"),
        (dict(n_pairs=4, seq_len=12, n_recalls=2), r"seq_len must be an integer >= 13 \(4 key-value pairs, 2 recalled"),
    ],
)
def test_associative_recall_recall_option_errors(options, message):
    with pytest.raises(ConfigError, match=message):
        AssociativeRecall(vocab_size=64, **options).check()
