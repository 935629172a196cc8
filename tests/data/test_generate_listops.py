import random

import numpy as np
import pytest

from longrange.data import load_task
from longrange.data.generate import listops as gen
from longrange.data.listops import tokenize_source
from longrange.errors import ConfigError

OPS = {"[MIN", "[MAX", "[MED", "[SM"}


# An evaluator written independently of the generator: it parses LRA's binary pair form
# "( left right )" and folds arguments into partially applied operators, as the pair form reads.
def parse_pairs(tokens, i=0):
    if tokens[i] == "(":
        left, i = parse_pairs(tokens, i + 1)
        right, i = parse_pairs(tokens, i)
        assert tokens[i] == ")", f"expected ) at token {i}"
        return (left, right), i + 1
    assert tokens[i] != ")"
    return tokens[i], i + 1


def apply(op, args):
    if op == "[MIN":
        return int(np.min(args))
    if op == "[MAX":
        return int(np.max(args))
    if op == "[MED":
        return int(np.median(args))
    return int(np.sum(args)) % 10


def fold(node):
    if isinstance(node, str):
        return node if node in OPS or node == "]" else int(node)
    left, right = fold(node[0]), fold(node[1])
    if isinstance(left, str):  # an operator meets its first argument
        assert left in OPS and isinstance(right, int)
        return ("partial", left, [right])
    assert isinstance(left, tuple) and left[0] == "partial"
    if right == "]":
        return apply(left[1], left[2])
    return ("partial", left[1], left[2] + [right])


def independent_value(source):
    tokens = source.split()
    tree, end = parse_pairs(tokens)
    assert end == len(tokens)
    value = fold(tree)
    assert isinstance(value, int)
    return value


def read_rows(path):
    raw = path.read_bytes()
    assert raw.startswith(b"Source\tTarget\r\n") and raw.endswith(b"\r\n")
    lines = raw.decode().split("\r\n")[1:-1]
    return [tuple(line.split("\t")) for line in lines]


def test_independent_evaluator_on_known_examples():
    assert independent_value("( ( ( [MAX 4 ) 5 ) ] )") == 5
    assert independent_value("( ( ( ( ( [MED 1 ) 2 ) 3 ) 6 ) ] )") == 2  # median 2.5 rounds down
    nested = "( ( ( [SM ( ( ( [MIN 7 ) 9 ) ] ) ) 8 ) ] )"
    assert independent_value(nested) == 5


def test_to_source_matches_the_lra_pair_form():
    assert gen.to_source(("[MAX", [4, 5])) == "( ( ( [MAX 4 ) 5 ) ] )"
    assert gen.to_source(7) == "7"


def test_evaluate_median_rounds_down_like_numpy():
    rng = random.Random(0)
    for _ in range(200):
        values = [rng.randrange(10) for _ in range(rng.randint(2, 10))]
        assert gen.evaluate(("[MED", values)) == int(np.median(values))


@pytest.fixture(scope="module")
def small_set(tmp_path_factory):
    out = tmp_path_factory.mktemp("listops")
    paths = gen.generate(out, n_train=300, n_val=40, n_test=40, min_length=20, max_length=90, seed=3, quiet=True)
    return out, paths


def test_every_label_matches_the_independent_evaluator(small_set):
    _, paths = small_set
    for path in paths.values():
        for source, target in read_rows(path):
            assert independent_value(source) == int(target), source


def test_length_window_counts_and_no_duplicates(small_set):
    _, paths = small_set
    assert {split: len(read_rows(p)) for split, p in paths.items()} == {"train": 300, "val": 40, "test": 40}
    sources = [s for p in paths.values() for s, _ in read_rows(p)]
    assert len(set(sources)) == len(sources)  # neither within nor across splits
    lengths = [len(tokenize_source(s)) for s in sources]
    assert 20 < min(lengths) and max(lengths) < 90


def test_deterministic_for_a_seed(small_set, tmp_path):
    out, paths = small_set
    again = gen.generate(
        tmp_path / "a", n_train=300, n_val=40, n_test=40, min_length=20, max_length=90, seed=3, quiet=True
    )
    for split in paths:
        assert again[split].read_bytes() == paths[split].read_bytes()
    other = gen.generate(
        tmp_path / "b", n_train=300, n_val=40, n_test=40, min_length=20, max_length=90, seed=4, quiet=True
    )
    assert other["train"].read_bytes() != paths["train"].read_bytes()


def test_generated_files_load_with_the_listops_task(small_set):
    out, paths = small_set
    data = load_task("listops", out)
    assert (len(data.train), len(data.val), len(data.test)) == (300, 40, 40)
    source, target = read_rows(paths["val"])[7]
    item = data.val[7]
    assert data.vocab.decode(item["inputs"]) == tokenize_source(source) + ["<eos>"]
    assert int(item["target"]) == int(target)


def test_lra_options_produce_lra_lengths(tmp_path):
    rows = gen.sample_dataset(5, seed=1)  # LRA window 500 < length < 2000, depth 10, 2..10 arguments
    for source, label in rows:
        assert 500 < len(tokenize_source(source)) < 2000
        assert independent_value(source) == label


def test_max_depth_and_max_args_are_respected():
    rng = random.Random(0)

    def depth_and_args(tree):
        if isinstance(tree, int):
            return 1, 0
        sub = [depth_and_args(a) for a in tree[1]]
        return 1 + max(d for d, _ in sub), max([len(tree[1])] + [a for _, a in sub])

    for _ in range(300):
        tree, length = gen.sample_tree(rng, max_depth=4, max_args=3)
        depth, args = depth_and_args(tree)
        assert depth <= 4 and args <= 3
        assert length == len(tokenize_source(gen.to_source(tree)))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(n_train=0), "listops generator option n_train must be an integer >= 1, got 0"),
        (dict(min_length=50, max_length=51), "max_length must be an integer >= 52 .*min_length \\+ 1 < max_length"),
        (dict(max_depth=2, max_args=2, min_length=10, max_length=100), "at most 4 tokens"),
        (dict(max_args=1), "max_args must be an integer >= 2"),
    ],
)
def test_bad_generator_options(tmp_path, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        gen.generate(tmp_path, **{"n_train": 5, "n_val": 1, "n_test": 1, **kwargs})
    assert not list(tmp_path.iterdir())


def test_exhausted_window_is_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(gen, "MAX_STALL", 2000)
    # lengths strictly between 0 and 3: only the 10 single values exist
    with pytest.raises(ConfigError, match="found only 10 distinct samples of the 20"):
        gen.generate(tmp_path, n_train=18, n_val=1, n_test=1, min_length=0, max_length=3)
