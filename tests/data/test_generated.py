"""Generated data built on first use (``task.generate``): one directory per configuration, built once,
reused, never mixed; its identity known before it exists; errors for what cannot be generated."""

from __future__ import annotations

import json

import pytest
import torch

import longrange.data  # noqa: F401  (registers every task and generator)
from longrange.data import tasks
from longrange.data.tasks import (
    GENERATED_MANIFEST,
    SequenceDataset,
    TaskData,
    TaskSpec,
    data_identity,
    data_state,
    ensure_generated,
    generated_root,
    load_task,
    register_generator,
    register_task,
)
from longrange.data.tokenize import Vocabulary
from longrange.errors import ConfigError, DataFormatError, DataMissingError


def _spec(size=4):
    return TaskSpec("gentoy", "tokens", 8, 2, "accuracy", 0.1, obtain="run `make-gentoy`")


def _loader(data_dir, spec, seed, skip_bad, size):
    values = (data_dir / "gentoy" / "values.txt").read_text().split()  # DataMissingError-like if absent
    ds = SequenceDataset([torch.tensor([int(v) + 5]) for v in values], torch.tensor([int(v) % 2 for v in values]))
    return TaskData(spec, ds, ds, ds, vocab=Vocabulary(["a", "b"]))


def _expected(data_dir, size):
    return [data_dir / "gentoy" / "values.txt"]


@pytest.fixture
def gentoy():
    builds = []

    def build(root, quiet=True, n=3, start=0, size=4):
        builds.append(dict(root=root, n=n, start=start, size=size))
        (root / "gentoy").mkdir(parents=True)
        (root / "gentoy" / "values.txt").write_text(" ".join(str(start + i) for i in range(n)))

    register_task("gentoy", _spec, _loader, {"size": 4}, expected=_expected)
    register_generator(
        "gentoy",
        build,
        {"n": 3, "start": 0, "size": 4},
        {"big": {"n": 6}},
        from_task=lambda options: {"size": options["size"]},
    )
    yield builds
    tasks.TASKS.unregister("gentoy")
    tasks.GENERATORS.unregister("gentoy")


def test_generated_data_is_built_on_first_use_then_reused(gentoy, tmp_path, capsys):
    data = load_task("gentoy", tmp_path, generate="big")
    assert len(data.train) == 6 and len(gentoy) == 1
    err = capsys.readouterr().err
    root = generated_root("gentoy", tmp_path, "big")
    assert f"generating gentoy data 'big' (n=6, start=0, size=4) into {root} on first use" in err  # the progress line
    assert root.parent == tmp_path / "generated" / "gentoy" and root.name.startswith("big-")
    assert json.loads((root / GENERATED_MANIFEST).read_text())["options"] == {"n": 6, "start": 0, "size": 4}
    assert load_task("gentoy", tmp_path, generate="big").info["generated"] == str(root)
    assert len(gentoy) == 1 and "generating" not in capsys.readouterr().err  # reused, not built again
    assert not [p for p in root.parent.iterdir() if p.name.startswith(".")]  # no build left aside


def test_two_configurations_never_share_a_directory(gentoy, tmp_path):
    a = load_task("gentoy", tmp_path, generate="big")
    b = load_task("gentoy", tmp_path, generate={"config": "big", "start": 10})
    c = load_task("gentoy", tmp_path, generate={"n": 6})  # the options of "big", from the defaults
    assert [int(x["inputs"]) for x in a.train] != [int(x["inputs"]) for x in b.train]
    roots = {generated_root("gentoy", tmp_path, g) for g in ("big", {"config": "big", "start": 10}, "default")}
    assert len(roots) == 3 and len(gentoy) == 3
    assert len(c.train) == 6
    # a task option that the generator follows is part of the configuration, too
    assert generated_root("gentoy", tmp_path, "big", {"size": 5}) not in roots


def test_identity_of_generated_data_is_known_before_it_is_built(gentoy, tmp_path):
    before = data_identity("gentoy", tmp_path, generate="big")
    ensure_generated("gentoy", tmp_path, "big", quiet=True)
    assert data_identity("gentoy", tmp_path, generate="big") == before  # a run made before it was built is the same run
    import shutil

    shutil.rmtree(generated_root("gentoy", tmp_path, "big"))
    ensure_generated("gentoy", tmp_path, "big", quiet=True)  # built again: same files, same identity
    assert data_identity("gentoy", tmp_path, generate="big") == before
    assert data_identity("gentoy", tmp_path, generate={"config": "big", "n": 7}) != before


def test_a_build_finished_by_another_process_first_is_kept(gentoy, tmp_path):
    root = generated_root("gentoy", tmp_path, "default")
    original = tasks.GENERATORS.get("gentoy").build

    def racing(tmp, quiet=True, **options):  # another process renames its complete build into place meanwhile
        other = root.parent / ".other"
        original(other, quiet, **options)
        (other / GENERATED_MANIFEST).write_text(json.dumps({"options": options}))
        other.rename(root)
        original(tmp, quiet, **options)

    register_generator("gentoy", racing, {"n": 3, "start": 0, "size": 4})
    assert ensure_generated("gentoy", tmp_path, "default", quiet=True) == root
    assert sorted(p.name for p in root.parent.iterdir()) == [root.name]  # this process' build was discarded


def test_a_directory_made_with_other_options_is_an_error(gentoy, tmp_path):
    root = ensure_generated("gentoy", tmp_path, "big", quiet=True)
    (root / GENERATED_MANIFEST).write_text(json.dumps({"options": {"n": 2, "start": 0, "size": 4}}))
    with pytest.raises(DataFormatError, match=r"made with other options.*delete that directory"):
        load_task("gentoy", tmp_path, generate="big")


def test_what_cannot_be_generated_is_a_clear_error(gentoy, tmp_path):
    with pytest.raises(ConfigError, match=r"unknown generated configuration 'huge'; known: big, default"):
        load_task("gentoy", tmp_path, generate="huge")
    with pytest.raises(ConfigError, match=r"unknown option 'm' for the gentoy generator \(task.generate\)"):
        load_task("gentoy", tmp_path, generate={"m": 2})
    with pytest.raises(ConfigError, match=r"task.generate.size=7 contradicts the task's options, which need size=4"):
        load_task("gentoy", tmp_path, generate={"size": 7})
    with pytest.raises(
        ConfigError, match=r"the data of task text cannot be generated \(tasks with a generator: .*listops"
    ):
        load_task("text", tmp_path, generate="default")
    # downloadable data keeps its clear error naming the file
    with pytest.raises(DataMissingError, match=r"listops/basic_train.tsv"):
        load_task("listops", tmp_path)


def test_data_state_says_present_generated_or_missing(gentoy, tmp_path):
    missing = data_state("gentoy", tmp_path)
    assert not missing.present and not missing.generated
    assert missing.describe("gentoy") == f"gentoy: MISSING {tmp_path / 'gentoy' / 'values.txt'}; run `make-gentoy`"
    later = data_state("gentoy", tmp_path, generate="big")
    assert later.generated and not later.present and "generated on first use into" in later.describe("gentoy")
    ensure_generated("gentoy", tmp_path, "big", quiet=True)
    assert data_state("gentoy", tmp_path, generate="big").present


def test_the_short_listops_is_a_named_configuration(tmp_path):
    """The demo's short ListOps: ListOps' generator configuration ``short`` (here with tiny counts)."""
    from longrange.data.generate.listops import CONFIGURATIONS

    assert CONFIGURATIONS["short"] == dict(
        n_train=8000, n_val=500, n_test=1000, min_length=32, max_length=128, max_depth=4, max_args=5
    )
    data = load_task(
        "listops", tmp_path, generate={"config": "short", "n_train": 30, "n_val": 5, "n_test": 5}, seq_len=128
    )
    assert (len(data.train), len(data.val), len(data.test)) == (30, 5, 5)
    assert max(len(x["inputs"]) for x in data.train) <= 128
    root = generated_root("listops", tmp_path, {"config": "short", "n_train": 30, "n_val": 5, "n_test": 5})
    assert (root / "listops" / "basic_train.tsv").is_file()


def test_pathfinder_generation_follows_the_task_options(tmp_path):
    data = load_task(
        "pathfinder", tmp_path, generate={"n_samples": 12, "samples_per_dir": 6}, resolution=16, difficulty=6
    )
    assert sum(len(s) for s in (data.train, data.val, data.test)) == 12
    assert data.train[0]["inputs"].shape[0] == 16 * 16
    with pytest.raises(ConfigError, match=r"task.generate.resolution=32 contradicts"):
        load_task("pathfinder", tmp_path, generate={"resolution": 32}, resolution=16, difficulty=6)
