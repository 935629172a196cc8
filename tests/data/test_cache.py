import os

import pytest
import torch

from longrange.data.cache import cache_dir, cache_path, cached
from longrange.errors import DataMissingError


class Counter:
    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return {"x": torch.arange(3) + self.calls, "names": ["a", "b"], "n": 3}


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "src.txt"
    path.write_text("hello")
    return path


def test_second_load_does_not_rebuild(tmp_path, source, capsys):
    build = Counter()
    first = cached(tmp_path, "toy", [source], {"a": 1}, build)
    assert "preparing toy (first run)" in capsys.readouterr().err
    second = cached(tmp_path, "toy", [source], {"a": 1}, build)
    assert build.calls == 1
    assert torch.equal(first["x"], second["x"]) and second["names"] == ["a", "b"] and second["n"] == 3
    assert capsys.readouterr().err == ""
    assert cache_dir(tmp_path) == tmp_path / ".cache"
    assert [p.suffix for p in (tmp_path / ".cache").iterdir()] == [".pt"]  # no temporary file left


def test_touching_a_source_or_changing_an_option_rebuilds(tmp_path, source):
    build = Counter()
    cached(tmp_path, "toy", [source], {"a": 1}, build)
    cached(tmp_path, "toy", [source], {"a": 2}, build)
    assert build.calls == 2
    cached(tmp_path, "toy", [source], {"a": 1}, build)  # the first entry is still there
    assert build.calls == 2
    st = source.stat()
    os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns + 10_000_000))
    out = cached(tmp_path, "toy", [source], {"a": 1}, build)
    assert build.calls == 3 and out["x"].tolist() == [3, 4, 5]


def test_directory_sources_are_fingerprinted_per_file(tmp_path):
    folder = tmp_path / "docs"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "a.txt").write_text("a")
    build = Counter()
    cached(tmp_path, "dir", [folder], {}, build)
    cached(tmp_path, "dir", [folder], {}, build)
    assert build.calls == 1
    (folder / "sub" / "a.txt").write_text("ab")  # size changes
    cached(tmp_path, "dir", [folder], {}, build)
    assert build.calls == 2


def test_option_order_does_not_matter(tmp_path, source):
    assert cache_path(tmp_path, "t", [source], {"a": 1, "b": 2}) == cache_path(
        tmp_path, "t", [source], {"b": 2, "a": 1}
    )
    assert cache_path(tmp_path, "t", [source], {}, version=1) != cache_path(tmp_path, "t", [source], {}, version=2)


def test_damaged_entry_is_rebuilt(tmp_path, source, capsys):
    build = Counter()
    cached(tmp_path, "toy", [source], {}, build)
    cache_path(tmp_path, "toy", [source], {}).write_bytes(b"garbage")
    out = cached(tmp_path, "toy", [source], {}, build)
    assert build.calls == 2 and out["n"] == 3
    assert "unreadable" in capsys.readouterr().err


def test_rebuild_flag_and_missing_source(tmp_path, source):
    build = Counter()
    cached(tmp_path, "toy", [source], {}, build)
    cached(tmp_path, "toy", [source], {}, build, rebuild=True)
    assert build.calls == 2
    with pytest.raises(DataMissingError, match="nope.txt"):
        cached(tmp_path, "toy", [tmp_path / "nope.txt"], {}, build)


class NotATensor:
    pass


def test_entries_load_with_weights_only(tmp_path, source, capsys):
    cached(tmp_path, "obj", [source], {}, lambda: {"obj": NotATensor()})

    def must_rebuild():
        raise RuntimeError("rebuilt")

    # the stored arbitrary object is refused by the weights-only loader, so the entry is rebuilt
    with pytest.raises(RuntimeError, match="rebuilt"):
        cached(tmp_path, "obj", [source], {}, must_rebuild)
    assert "unreadable" in capsys.readouterr().err
