import pytest
import torch
from torch.utils.data import DataLoader

from longrange.data import tasks
from longrange.data.tasks import (
    SequenceDataset,
    TaskData,
    TaskSpec,
    get_spec,
    list_tasks,
    load_task,
    pack,
    register_task,
    subset_indices,
    task_status,
    unpack,
)
from longrange.data.tokenize import Vocabulary
from longrange.errors import ConfigError, DataFormatError


def toy_spec(seq_len=8, flavour="a"):
    return TaskSpec("toy", "tokens", seq_len, 3, "accuracy", 0.15, description=f"toy {flavour}")


def toy_loader(data_dir, spec, seed, skip_bad, seq_len, flavour):
    n = 20
    inputs = [torch.full((1 + i % spec.seq_len,), 5 + i % 2) for i in range(n)]
    ds = SequenceDataset(inputs, torch.arange(n) % 3)
    return TaskData(spec, ds, ds, ds, vocab=Vocabulary(["x", "y"]), info={"dir": str(data_dir), "seed": seed})


def toy_expected(data_dir, seq_len, flavour):
    return [data_dir / "toy" / "a.txt", data_dir / "toy" / "b.txt"]


@pytest.fixture
def toy(monkeypatch):
    register_task("toy", toy_spec, toy_loader, {"seq_len": 8, "flavour": "a"}, expected=toy_expected)
    yield "toy"
    tasks.TASKS.unregister("toy")


def test_registry_lists_and_builds_specs(toy):
    assert "toy" in list_tasks() and list_tasks() == sorted(list_tasks())
    assert get_spec("toy").seq_len == 8
    assert get_spec("toy", seq_len=16).seq_len == 16


def test_unknown_task_and_option_are_config_errors(toy):
    with pytest.raises(ConfigError, match=r"unknown task 'nope'.*toy"):
        get_spec("nope")
    with pytest.raises(
        ConfigError,
        match=r"unknown option 'seqlen' for task toy \(did you mean 'seq_len'\?\); valid options: flavour, seq_len",
    ):
        load_task("toy", "x", seqlen=3)


def test_data_dir_defaults_to_env_then_data(toy, monkeypatch, tmp_path):
    monkeypatch.setenv("LONGRANGE_DATA", str(tmp_path))
    assert load_task("toy").info["dir"] == str(tmp_path)
    monkeypatch.delenv("LONGRANGE_DATA")
    assert load_task("toy").info["dir"] == "data"
    assert load_task("toy", tmp_path / "z").info["dir"] == str(tmp_path / "z")


def test_train_subset_fraction_and_count_are_deterministic_and_nested(toy):
    a = load_task("toy", "d", seed=1, train_subset=0.25)
    b = load_task("toy", "d", seed=1, train_subset=0.25)
    assert len(a.train) == 5 and a.train.indices == b.train.indices
    c = load_task("toy", "d", seed=1, train_subset=10)
    assert len(c.train) == 10 and set(a.train.indices) <= set(c.train.indices)
    assert load_task("toy", "d", seed=2, train_subset=10).train.indices != c.train.indices
    assert len(a.val) == 20  # only the training set is subset
    assert a.info["train_size_full"] == 20


@pytest.mark.parametrize("bad", [0.0, 1.5, -0.1, 0, 21, True, "half"])
def test_bad_train_subset(bad):
    with pytest.raises(ConfigError, match="train_subset"):
        subset_indices(20, bad, seed=0)


def test_subset_fraction_rounds_to_at_least_one():
    assert len(subset_indices(20, 0.01, seed=0)) == 1
    assert subset_indices(20, 1.0, seed=3) == list(range(20))


def test_collate_pads_with_the_vocabulary_pad_id(toy):
    data = load_task("toy", "d")
    batch = next(iter(DataLoader(data.train, batch_size=4, collate_fn=data.collate)))
    assert batch["inputs"].shape == (4, 4)
    assert batch["lengths"].tolist() == [1, 2, 3, 4]
    assert batch["inputs"][0].tolist() == [5, 0, 0, 0]
    assert batch["targets"].tolist() == [0, 1, 2, 0]
    assert data.vocab_size == 7


def test_collate_refuses_labels_outside_the_classes(toy):
    data = load_task("toy", "x")
    items = [data.train[0], {"inputs": torch.tensor([5, 6]), "target": torch.tensor(3)}]
    with pytest.raises(DataFormatError, match=r"class label 3 in a batch of task toy is outside \[0, 3\)"):
        data.collate(items)
    items[1]["target"] = torch.tensor(-1)
    with pytest.raises(DataFormatError, match="class label -1"):
        data.collate(items)
    assert data.collate(items[:1])["targets"].tolist() == [0]


def test_task_status_reports_each_expected_path(toy, tmp_path):
    (tmp_path / "toy").mkdir()
    (tmp_path / "toy" / "a.txt").write_text("")
    present, lines = task_status("toy", tmp_path)
    assert not present
    assert lines == [f"{tmp_path / 'toy' / 'a.txt'}: found", f"{tmp_path / 'toy' / 'b.txt'}: missing"]
    (tmp_path / "toy" / "b.txt").write_text("")
    assert task_status("toy", tmp_path)[0]


def test_pack_unpack_round_trip():
    seqs = [torch.tensor([1, 2]), torch.tensor([], dtype=torch.long), torch.tensor([3])]
    flat, offsets = pack(seqs)
    assert offsets.tolist() == [0, 2, 2, 3]
    assert [s.tolist() for s in unpack(flat, offsets)] == [[1, 2], [], [3]]
    ds = SequenceDataset.from_packed(flat, offsets, torch.tensor([0, 1, 0]), flat, offsets)
    assert ds[0]["inputs2"].tolist() == [1, 2] and int(ds[1]["target"]) == 1


def test_sequence_dataset_checks_lengths():
    with pytest.raises(ValueError, match="2 inputs but 1 targets"):
        SequenceDataset([torch.zeros(1), torch.zeros(1)], torch.zeros(1))


def test_task_spec_validates_fields():
    with pytest.raises(ConfigError, match="input_kind"):
        TaskSpec("t", "pixels", 8, 2, "accuracy", 0.1)
    with pytest.raises(ConfigError, match="metric"):
        TaskSpec("t", "tokens", 8, 2, "f1", 0.1)


def test_core_tasks_are_registered_with_their_specs():
    assert {"listops", "text", "retrieval"} <= set(list_tasks())
    assert get_spec("listops").seq_len == 2048 and get_spec("listops").mask_ratio == 0.1
    assert get_spec("text").seq_len == 4096 and get_spec("text", seq_len=1024).seq_len == 1024
    assert get_spec("retrieval").two_sequences


def test_compact_ids_are_served_as_long():
    from longrange.data.tasks import id_dtype

    assert id_dtype(100) == torch.int16 and id_dtype(70000) == torch.int32
    flat, offsets = pack([[1, 2, 30000], [4]], dtype=torch.int16)
    assert flat.dtype == torch.int16
    item = SequenceDataset.from_packed(flat, offsets, torch.tensor([0, 1]))[0]
    assert item["inputs"].dtype == torch.long and item["inputs"].tolist() == [1, 2, 30000]
    numeric = SequenceDataset([torch.zeros(3, 2)], torch.zeros(1, 1))[0]
    assert numeric["inputs"].dtype == torch.float32
