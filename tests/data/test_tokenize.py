import json

import pytest
import torch

from longrange.data.batch import PAD_ID
from longrange.data.tokenize import SPECIALS, Vocabulary
from longrange.errors import DataFormatError


def test_specials_take_ids_0_to_4():
    vocab = Vocabulary(["a", "b"])
    assert [vocab.pad_id, vocab.unk_id, vocab.eos_id, vocab.cls_id, vocab.mask_id] == [0, 1, 2, 3, 4]
    assert vocab.decode(range(5)) == list(SPECIALS)
    assert vocab.pad_id == PAD_ID
    assert len(vocab) == 7
    assert vocab.encode(["a", "b"]) == [5, 6]


def test_unknown_token_maps_to_unk_when_not_strict():
    vocab = Vocabulary(["a"])
    assert vocab.encode(["a", "z"]) == [5, vocab.unk_id]


def test_strict_vocabulary_rejects_unknown_and_special_tokens_naming_where():
    vocab = Vocabulary(["a"], strict=True)
    with pytest.raises(DataFormatError, match=r"f\.tsv, line 3: token 'z' \(position 1\)"):
        vocab.encode(["a", "z"], where="f.tsv, line 3")
    with pytest.raises(DataFormatError, match="'<pad>'"):
        vocab.encode(["<pad>"])


def test_build_orders_by_count_then_token_and_applies_min_count():
    docs = ["bbaac", "ab", "dd"]  # counts: a3 b3 c1 d2
    vocab = Vocabulary.build(docs, min_count=2)
    assert vocab.tokens == ("a", "b", "d")
    assert Vocabulary.build(reversed(docs), min_count=2) == vocab
    # lists of multi-character tokens
    vocab = Vocabulary.build([["[MAX", "1", "]"], ["1"]])
    assert vocab.tokens == ("1", "[MAX", "]")


def test_build_ignores_special_strings_in_data():
    vocab = Vocabulary.build([["<pad>", "x", "<mask>"]])
    assert vocab.tokens == ("x",)


def test_bad_construction():
    with pytest.raises(ValueError, match="reserved"):
        Vocabulary(["<eos>"])
    with pytest.raises(ValueError, match="duplicate"):
        Vocabulary(["a", "a"])
    with pytest.raises(ValueError, match="min_count"):
        Vocabulary.build(["a"], min_count=0)
    with pytest.raises(ValueError, match="outside"):
        Vocabulary(["a"]).decode([6])


def test_save_load_round_trip(tmp_path):
    vocab = Vocabulary(["é", "\t", "x"], strict=True)
    vocab.save(tmp_path / "v.json")
    loaded = Vocabulary.load(tmp_path / "v.json")
    assert loaded == vocab and loaded.strict
    assert loaded.decode(torch.tensor(loaded.encode(["x", "é"]))) == ["x", "é"]


def test_load_rejects_bad_files(tmp_path):
    path = tmp_path / "v.json"
    path.write_text("{not json")
    with pytest.raises(DataFormatError, match="unreadable"):
        Vocabulary.load(path)
    obj = Vocabulary(["a"]).to_dict()
    obj["specials"] = ["<pad>", "<unk>"]
    path.write_text(json.dumps(obj))
    with pytest.raises(DataFormatError, match="special tokens"):
        Vocabulary.load(path)
    obj = Vocabulary(["a"]).to_dict()
    obj["tokens"] = ["a", "a"]
    path.write_text(json.dumps(obj))
    with pytest.raises(DataFormatError, match="duplicate"):
        Vocabulary.load(path)


def random_texts(seed, n=30):
    import random

    rng = random.Random(seed)
    alphabet = "abcde \t\n<>é€🙂\u0000" + chr(0x10FFFF)
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(n)]


@pytest.mark.parametrize("min_count", [1, 3, 50])
def test_build_chars_matches_build(min_count):
    texts = random_texts(min_count)
    assert Vocabulary.build_chars(texts, min_count=min_count) == Vocabulary.build(texts, min_count=min_count)
    assert Vocabulary.build_chars([], min_count=min_count) == Vocabulary.build([], min_count=min_count)


def test_encode_chars_matches_encode():
    vocab = Vocabulary.build(random_texts(0)[:10], min_count=2)  # some characters stay unknown
    vocab_with_words = Vocabulary(["ab", "a", "🙂"])  # multi-character tokens never match a character
    for v in (vocab, vocab_with_words):
        for text in random_texts(1) + ["", "<pad>"]:
            fast = v.encode_chars(text)
            assert fast.dtype.name == "int32"
            assert fast.tolist() == v.encode(list(text))


def test_encode_chars_strict_locates_the_bad_character():
    vocab = Vocabulary(["a", "b"], strict=True)
    assert vocab.encode_chars("abba").tolist() == [5, 6, 6, 5]
    with pytest.raises(DataFormatError, match=r"doc.txt, line 2: token 'z' \(position 2\)"):
        vocab.encode_chars("abz", path="doc.txt", line=2)
