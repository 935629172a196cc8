"""The ``head`` section of a run's configuration as a type (``longrange.models.record``): what a
stage writes is what inference reads to rebuild the model."""

from __future__ import annotations

import pytest
import torch
import yaml

from longrange.errors import DataFormatError
from longrange.models.config import ModelConfig
from longrange.models.model import build_model
from longrange.models.record import HEAD_FIELDS, HeadRecord

MODEL = dict(block="simple", primitive="s4d", n_layers=1, d_model=8, d_state=4, direction="causal")


def test_a_record_round_trips_through_yaml_and_builds_the_same_model():
    head = HeadRecord(kind="classify", n_out=3, input_kind="tokens", vocab_size=12)
    saved = yaml.safe_load(yaml.safe_dump(head.to_json()))
    assert set(saved) <= set(HEAD_FIELDS) and "vocab" not in saved and "hf_resolved" not in saved
    back = HeadRecord.from_json(saved, "run/config.yaml")
    assert back == head and HeadRecord.from_json(back) is back
    torch.manual_seed(0)
    built = back.build(MODEL)
    torch.manual_seed(0)
    direct = build_model(ModelConfig(**MODEL), input_kind="tokens", head="classify", n_out=3, vocab_size=12)
    x = torch.randint(5, 12, (2, 7))
    torch.testing.assert_close(built(x), direct(x))


def test_a_record_saved_without_the_optional_fields_reads_with_their_defaults():
    head = HeadRecord.from_json({"kind": "tokens", "n_out": 9, "input_kind": "numeric"})
    assert (head.vocab_size, head.d_input, head.mask_channel, head.vocab) == (None, 1, False, None)
    assert HeadRecord.from_json({**head.to_json(), "vocab": ["a", "b"]}).vocab == ("a", "b")


@pytest.mark.parametrize(
    "section, message",
    [
        ({"n_out": 3, "input_kind": "tokens"}, "missing field 'head.kind'"),
        ({"kind": "classify", "n_out": "3", "input_kind": "tokens"}, "field 'head.n_out' must be int, got str '3'"),
        (
            {"kind": "classify", "n_out": 3, "input_kind": "tokens", "mask_channel": 1},
            "field 'head.mask_channel' must be bool, got int 1",
        ),
        (["classify"], "section 'head' must be a mapping, got list"),
    ],
)
def test_a_bad_record_names_the_file_and_the_field(section, message):
    with pytest.raises(DataFormatError, match=r"run/config.yaml: " + message):
        HeadRecord.from_json(section, "run/config.yaml")
