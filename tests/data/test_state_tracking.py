"""The state-tracking tasks (parity, modular arithmetic without and with brackets; Grazzi et al.
2025 on the xLSTM code's formal languages): the published defaults, layouts, the lengths of the
training and held-out splits, reference solvers at 100% on every split, the solver against
hand-written expressions, determinism, option errors, new inputs, and a tiny model trained on each."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from longrange.data import IGNORE_INDEX, get_spec, load_task, task_options
from longrange.data.batch import collate
from longrange.data.generate.base import example_rng
from longrange.data.generate.state_tracking import (
    STATE_TRACKING,
    ModularArithmetic,
    ModularArithmeticBrackets,
    Parity,
)
from longrange.data.inputs import INPUT_READERS, read_inputs
from longrange.data.synthetic import task_vocabulary
from longrange.data.tokenize import FIRST_TOKEN_ID
from longrange.errors import ConfigError, DataFormatError

TASKS = sorted(STATE_TRACKING)
SMALL = dict(min_len=3, max_len=12, eval_min_len=12, eval_max_len=30, n_train=32, n_val=16, n_test=16)


def draws(gen, n=300, training=True, seed=0):
    return [gen.draw(example_rng(seed, 7, i), training=training) for i in range(n)]


def words(gen, tokens) -> str:
    names = gen.token_names()
    return " ".join(names[t] for t in tokens)


def encode(gen, text: str) -> list[int]:
    names = gen.token_names()
    return [names.index(w) for w in text.split()]


# --------------------------------------------------------------------------------- registration
def test_defaults_are_the_published_settings():
    """The xLSTM code's configurations as Grazzi et al. ran them: lengths 3-40 for training, 40-256
    for validation and test, 8,192 of each, one fresh example per training example seen, and its
    vocabularies (3, 10 and 12 tokens: ours are the same tokens, after the specials)."""
    expected = {
        "parity": dict(modulus=2, n_train=20_000 * 256, vocab=3),
        "modular-arithmetic": dict(modulus=5, n_train=100_000 * 256, vocab=10),
        "modular-arithmetic-brackets": dict(modulus=5, n_train=100_000 * 256, vocab=12, mult=True),
    }
    for task, want in expected.items():
        opts = task_options(task)
        assert (opts["min_len"], opts["max_len"], opts["eval_min_len"], opts["eval_max_len"]) == (3, 40, 40, 256)
        assert (opts["n_val"], opts["n_test"], opts["n_train"]) == (8192, 8192, want["n_train"])
        assert opts["modulus"] == want["modulus"] and opts.get("mult") == want.get("mult")
        spec = get_spec(task)
        assert STATE_TRACKING[task]().vocab_size == want["vocab"]
        assert spec.n_classes == want["vocab"] + FIRST_TOKEN_ID and spec.per_position and not spec.causal
        assert spec.chance == pytest.approx(1 / want["modulus"])
        assert spec.seq_len == (256 if task == "parity" else 255)


# -------------------------------------------------------------------------------------- layouts
def test_parity_layout():
    gen = Parity(modulus=2)
    for ex in draws(gen):
        *symbols, query = ex.inputs.tolist()
        assert query == 2 and set(symbols) <= {0, 1}
        assert (ex.targets[:-1] == IGNORE_INDEX).all() and ex.targets[-1] == sum(symbols) % 2
    counts = Parity(modulus=3)
    assert {int(ex.targets[-1]) for ex in draws(counts)} == {0, 1, 2}


def test_modular_arithmetic_layout():
    gen = ModularArithmetic()
    plus, times, eq, query = gen.token("+"), gen.token("*"), gen.token("="), gen.query
    ops = set()
    for ex in draws(gen):
        tokens = ex.inputs.tolist()
        assert len(tokens) % 2 == 1 and tokens[-2:] == [eq, query]
        expression = tokens[:-2]
        assert all(0 <= t < 5 for t in expression[0::2]) and all(plus <= t <= times for t in expression[1::2])
        ops |= set(expression[1::2])
        # the value as Python computes it, with * before + and -
        text = words(gen, expression)
        assert ex.targets[-1] == eval(text) % 5  # noqa: S307 (our own digits and operators)
    assert ops == {plus, gen.token("-"), times}


def test_bracketed_expressions_are_balanced_and_multiply_only_with_mult():
    for mult in (False, True):
        gen = ModularArithmeticBrackets(mult=mult)
        seen_times = False
        for ex in draws(gen):
            tokens = ex.inputs.tolist()
            assert tokens[-2:] == [gen.token("="), gen.query]
            text = words(gen, tokens[:-2])
            depth = 0
            for w in text.split():
                depth += {"(": 1, ")": -1}.get(w, 0)
                assert depth >= 0
            assert depth == 0
            seen_times |= "*" in text
            # Python reads '- -3' as 3, as the task does
            assert ex.targets[-1] == eval(text) % 5  # noqa: S307 (our own digits, brackets and operators)
        assert seen_times == mult


# -------------------------------------------------------------------------------------- lengths
def test_training_lengths_are_short_and_held_out_lengths_long():
    for task in TASKS:
        data = load_task(task, seed=0, n_train=400, n_val=400, n_test=10)
        train = {len(data.train.example(i).inputs) for i in range(400)}
        held = {len(data.val.example(i).inputs) for i in range(400)}
        assert max(train) <= 40 and min(held) >= 38 and max(held) <= 256
        assert max(train) < min(held) + 3  # the ranges meet at 40
        assert len(held) > 100  # spread over the range


def test_lengths_are_drawn_as_the_xlstm_code_draws_them():
    parity = {len(ex.inputs) for ex in draws(Parity(), 2000)}
    assert parity == set(range(3, 41))
    # 2k - 1 with k uniform in [min((lo+1)//2, (hi+1)//2), (hi+1)//2]: odd 3..39, and 39..255 held out
    arith = {len(ex.inputs) for ex in draws(ModularArithmetic(), 2000)}
    assert arith == set(range(3, 40, 2))
    held = {len(ex.inputs) for ex in draws(ModularArithmetic(), 4000, training=False)}
    assert min(held) == 39 and max(held) == 255 and all(n % 2 for n in held)
    # max(uniform(lo, hi), 5), less the padding token after the answer
    brackets = [len(ex.inputs) for ex in draws(ModularArithmeticBrackets(), 3000)]
    assert set(brackets) == set(range(4, 40))
    assert brackets.count(4) > 2.5 * brackets.count(5)  # lengths 3, 4 and 5 all give 5


def test_a_batch_pads_the_shorter_examples_at_the_end():
    data = load_task("parity", seed=0, **SMALL)
    items = [data.val[i] for i in range(4)]
    batch = collate(items)
    lengths = [len(it["inputs"]) for it in items]
    assert batch["inputs"].shape[1] == max(lengths) and batch["lengths"].tolist() == lengths
    for row, n in enumerate(lengths):
        assert batch["targets"][row, n - 1] >= FIRST_TOKEN_ID
        assert (batch["targets"][row, n:] == IGNORE_INDEX).all() and (
            batch["targets"][row, : n - 1] == IGNORE_INDEX
        ).all()


# --------------------------------------------------------------------------------------- solvers
@pytest.mark.parametrize(
    "task, options",
    [
        ("parity", {}),
        ("parity", dict(modulus=3)),
        ("modular-arithmetic", {}),
        ("modular-arithmetic", dict(modulus=7)),
        ("modular-arithmetic-brackets", {}),
        ("modular-arithmetic-brackets", dict(mult=False)),
    ],
)
def test_reference_solver_scores_100_percent_on_every_split(task, options):
    data = load_task(task, seed=3, **{**SMALL, "n_train": 200, "n_val": 200}, **options)
    gen = data.train.generator
    for split in (data.train, data.val, data.test):
        for i in range(len(split)):
            ex = split.example(i)
            assert gen.solve(ex.inputs) == ex.targets[-1], (split.split, i)


@pytest.mark.parametrize(
    "task, text, answer",
    [
        ("modular-arithmetic", "2 + 3 * 4 =", (2 + 12) % 5),
        ("modular-arithmetic", "1 - 2 * 3 - 4 =", (1 - 6 - 4) % 5),
        ("modular-arithmetic", "4 * 4 * 4 + 0 =", 64 % 5),
        ("modular-arithmetic", "3 =", 3),
        ("modular-arithmetic-brackets", "( - 3 - ( 2 ) ) =", (-3 - 2) % 5),
        ("modular-arithmetic-brackets", "( ( 1 + 4 ) - - 2 ) =", (5 + 2) % 5),
        ("modular-arithmetic-brackets", "( - 4 ) =", 1),
    ],
)
def test_the_solver_reads_hand_written_expressions(task, text, answer):
    gen = STATE_TRACKING[task]()
    assert gen.solve([*encode(gen, text), gen.query]) == answer


@pytest.mark.parametrize(
    "task, text, error",
    [
        ("parity", "0 1 1", r"the last token must be the query token 2"),
        ("parity", "0 1 ? ?", r"only symbols may come before the query token"),
        ("modular-arithmetic", "2 + = ?", r"position 2: expected a number, found '='"),
        ("modular-arithmetic", "2 3 = ?", r"position 1: expected '=' ending the expression, found '3'"),
        ("modular-arithmetic", "- 2 = ?", r"position 0: expected a number, found '-'"),
        ("modular-arithmetic", "2 + 3 ?", r"expected '=' ending the expression, found None"),
        ("modular-arithmetic-brackets", "( 2 + 3 = ?", r"position 4: expected '\)', found '='"),
        ("modular-arithmetic-brackets", "( 2 * 3 ) = ?", r"'\*' appears, but the task's option mult is false"),
    ],
)
def test_the_solver_says_what_is_wrong_with_a_bad_input(task, text, error):
    gen = STATE_TRACKING[task](**({"mult": False} if "*" in text else {}))
    with pytest.raises(ValueError, match=error):
        gen.solve(encode(gen, text))


def test_tokens_outside_the_task_are_named():
    with pytest.raises(ValueError, match=r"token 9 is outside the task's tokens 0 \.\. 2"):
        Parity().solve([0, 9, 2])


# ----------------------------------------------------------------------------------- identity
@pytest.mark.parametrize("task", TASKS)
def test_same_seed_same_data_other_seed_or_split_other_data(task):
    a, b, c = (load_task(task, seed=s, **SMALL) for s in (0, 0, 1))
    first = [a.val.example(i).inputs.tolist() for i in range(8)]
    assert first == [b.val.example(i).inputs.tolist() for i in range(8)]
    assert first != [c.val.example(i).inputs.tolist() for i in range(8)]
    assert first != [a.test.example(i).inputs.tolist() for i in range(8)]


@pytest.mark.parametrize(
    "task, options, message",
    [
        (
            "parity",
            dict(max_len=2, min_len=3),
            r"parity option max_len must be an integer >= 3 \(at least min_len\), got 2",
        ),
        ("parity", dict(modulus=1), r"parity option modulus must be an integer in \[2, 1000\], got 1"),
        ("modular-arithmetic", dict(min_len=2), r"modular-arithmetic option min_len must be an integer >= 3, got 2"),
        (
            "modular-arithmetic-brackets",
            dict(eval_min_len=300),
            r"eval_max_len must be an integer >= 300 \(at least eval_min_len\), got 256",
        ),
        ("modular-arithmetic-brackets", dict(mult=1), r"option mult must be true or false, got 1"),
    ],
)
def test_option_errors_name_the_option_and_its_range(task, options, message):
    with pytest.raises(ConfigError, match=message):
        get_spec(task, **options)
    with pytest.raises(ConfigError, match=message):
        load_task(task, **options)


# ---------------------------------------------------------------------------------- new inputs
@pytest.mark.parametrize("task", TASKS)
def test_predict_reads_json_lines_and_scores_the_last_position(task, tmp_path):
    assert task in INPUT_READERS.names()
    gen = STATE_TRACKING[task](**{k: v for k, v in SMALL.items() if not k.startswith("n_")})
    drawn = draws(gen, 4, training=False)
    path = tmp_path / "new.jsonl"
    path.write_text(
        "".join(
            json.dumps({"id": i, "tokens": ex.inputs.tolist(), "answers": [int(ex.targets[-1])]}) + "\n"
            for i, ex in enumerate(drawn)
        )
    )
    spec = get_spec(task, **SMALL)
    records = read_inputs(task, path, task_vocabulary(gen.vocab_size), spec, **SMALL)
    for ex, record in zip(drawn, records):
        assert record.positions == [len(ex.inputs) - 1]
        assert torch.equal(record.item["inputs"], torch.from_numpy(ex.inputs + FIRST_TOKEN_ID))
        assert int(record.item["target"][-1]) - FIRST_TOKEN_ID == ex.targets[-1]


def test_a_new_input_longer_than_the_held_out_lengths_names_the_option_that_allows_it(tmp_path):
    path = tmp_path / "long.jsonl"
    gen = Parity()
    path.write_text(json.dumps({"id": "a", "tokens": [0] * 300 + [gen.query]}) + "\n")
    with pytest.raises(
        DataFormatError,
        match=r"301 tokens, more than the task's seq_len 256 \(a longer input: --task-option eval_max_len=N\)",
    ):
        read_inputs("parity", path, task_vocabulary(gen.vocab_size), get_spec("parity"))


def test_a_bad_new_input_names_the_line_and_the_position(tmp_path):
    path = tmp_path / "bad.jsonl"
    gen = ModularArithmetic()
    path.write_text(json.dumps({"id": "a", "tokens": [2, 5, 8, 9]}) + "\n")  # 2 + = ?
    with pytest.raises(DataFormatError, match=r"bad.jsonl, line 1: field 'tokens': position 2: expected a number"):
        read_inputs("modular-arithmetic", path, task_vocabulary(gen.vocab_size), get_spec("modular-arithmetic"))


# ----------------------------------------------------------------------------------- training
def test_a_tiny_model_trains_on_each_task(tmp_path):
    from longrange.experiment.config import experiment_from_dict
    from longrange.experiment.execute import run_stage
    from longrange.experiment.stage import resolve_stage

    for task in TASKS:
        exp = {
            "label": task,
            "task": {"name": task, "options": dict(SMALL)},
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
        assert 0.0 <= summary["test"]["accuracy"] <= 1.0
        assert np.isfinite(summary["test"]["loss"])
