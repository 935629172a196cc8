"""DNA species task: FASTA indexing and seeking, windows, splits, data-scarcity pools, errors, cache."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

import longrange.data  # noqa: F401  (registers the tasks)
from longrange.data import get_spec, load_task
from longrange.data.species import encode_bases, index_fasta, read_window
from longrange.errors import ConfigError, DataFormatError, DataMissingError

WIDTH = 7


def write_fasta(path, seq: str, width=WIDTH, name="chr", newline="\n", gz=False):
    lines = [f">{name} test"] + [seq[i : i + width] for i in range(0, len(seq), width)]
    data = (newline.join(lines) + newline).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)


def make_species(tmp_path, names=("human", "mouse"), chroms=("1", "2", "4", "5"), length=60, seed=0, gz=()):
    """Random sequences per (species, chromosome); returns {(species, chrom): canonical sequence}."""
    rng = np.random.default_rng(seed)
    seqs = {}
    for sp in names:
        for c in chroms:
            n = length + 3 * int(c)
            s = "".join(rng.choice(list("ACGTacgtNR"), size=n))
            gzipped = (sp, c) in gz
            write_fasta(tmp_path / "species" / sp / (f"chr{c}.fa.gz" if gzipped else f"chr{c}.fa"), s, gz=gzipped)
            seqs[(sp, c)] = s.upper().replace("R", "N")
    return seqs


def _ids(s: str) -> list[int]:
    return ["ACGTN".index(ch) + 5 for ch in s]


def test_index_and_seek_match_the_sequence(tmp_path):
    seq = "".join(np.random.default_rng(1).choice(list("ACGTNacgtn"), size=50))
    for newline in ("\n", "\r\n"):
        path = tmp_path / f"x{len(newline)}.fa"
        write_fasta(path, seq, newline=newline)
        idx = index_fasta(path)
        assert idx["length"] == 50 and idx["line_bases"] == WIDTH and idx["line_bytes"] == WIDTH + len(newline)
        for start, end in [(0, 50), (0, 1), (6, 8), (13, 14), (20, 49), (49, 50), (10, 10)]:
            assert read_window(path, idx, start, end) == seq[start:end].upper().encode()
    assert encode_bases(b"ACGTN").tolist() == [5, 6, 7, 8, 9]


def test_iupac_and_soft_mask_canonicalised(tmp_path):
    path = tmp_path / "c.fa"
    write_fasta(path, "acgtRYKMswbdhvnU")
    assert read_window(path, index_fasta(path), 0, 16) == b"ACGTNNNNNNNNNNNN"


@pytest.mark.parametrize(
    "text, line, message",
    [
        ("ACGT\nACGT\n", 1, "malformed FASTA header"),
        (">\nACGT\n", 1, "malformed FASTA header"),
        (">a\nACGT\nACGT\n>b\nACGT\n", 4, "a second sequence header"),
        (">a\nACGTA\nACG\nACGTA\n", 4, "non-uniform line width: line 3"),
        (">a\nACGT\nACGTA\n", 3, "non-uniform line width: 5 bases, expected 4"),
        (">a\nACGT\nAC-T\n", 3, "invalid character '-'"),
        (">a\nACGT\n\nACGT\n", 4, "sequence continues after the blank line 3"),
    ],
)
def test_malformed_fasta_names_file_and_line(tmp_path, text, line, message):
    path = tmp_path / "bad.fa"
    path.write_text(text)
    with pytest.raises(DataFormatError, match=rf"bad\.fa, line {line}: {message}"):
        index_fasta(path)


def test_trailing_blank_lines_are_fine(tmp_path):
    path = tmp_path / "ok.fa"
    path.write_text(">a\nACGT\nAC\n\n")
    assert index_fasta(path)["length"] == 6


def test_end_to_end_windows_and_splits(tmp_path):
    seqs = make_species(tmp_path)
    data = load_task(
        "species",
        tmp_path,
        species="human,mouse",
        seq_len=16,
        samples_per_epoch=40,
        eval_samples=12,
        partial=True,
        seed=3,
    )
    assert data.spec.n_classes == 2 and data.spec.input_kind == "tokens" and data.vocab_size == 10
    assert (len(data.train), len(data.val), len(data.test)) == (40, 12, 12)
    # HyenaDNA split: chr1 validation, chr5 test, chr2/chr4 training
    assert data.info["chromosomes"]["val"] == {"human": ["1"], "mouse": ["1"]}
    assert data.info["chromosomes"]["test"] == {"human": ["5"], "mouse": ["5"]}
    assert data.info["chromosomes"]["train"] == {"human": ["2", "4"], "mouse": ["2", "4"]}
    labels = set()
    for ds, allowed in ((data.train, {"2", "4"}), (data.val, {"1"}), (data.test, {"5"})):
        for i in range(len(ds)):
            region, start, end = ds.window(i)
            assert region.chromosome in allowed
            assert 0 <= start < end <= region.limit and end - start <= 16
            item = ds[i]
            assert int(item["target"]) == ["human", "mouse"].index(region.species)
            assert item["inputs"].tolist() == _ids(seqs[(region.species, region.chromosome)][start:end])
            labels.add(int(item["target"]))
    assert labels == {0, 1}


def test_windows_deterministic_and_epochs(tmp_path):
    make_species(tmp_path)
    opts = dict(species="human,mouse", seq_len=16, samples_per_epoch=30, eval_samples=10, partial=True)
    a = load_task("species", tmp_path, seed=0, **opts)
    b = load_task("species", tmp_path, seed=0, **opts)
    c = load_task("species", tmp_path, seed=1, **opts)
    win = lambda ds: [(r.species, r.chromosome, s, e) for r, s, e in (ds.window(i) for i in range(len(ds)))]  # noqa: E731
    assert win(a.train) == win(b.train) and win(a.val) == win(b.val)
    assert win(a.train) != win(c.train)
    epoch0, val0 = win(a.train), win(a.val)
    a.train.set_epoch(1)
    a.val.set_epoch(1)
    assert win(a.train) != epoch0 and win(a.val) == val0
    b.train.set_epoch(1)
    assert win(a.train) == win(b.train)


def test_padding_past_the_chromosome_end(tmp_path):
    seqs = make_species(tmp_path, length=10)
    data = load_task(
        "species", tmp_path, species="human,mouse", seq_len=32, samples_per_epoch=20, eval_samples=4, partial=True
    )
    items = [data.train[i] for i in range(20)]
    assert all(len(it["inputs"]) < 32 for it in items)  # chromosomes of 16..22 bases
    for i in range(20):
        region, start, end = data.train.window(i)
        assert end == region.limit == len(seqs[(region.species, region.chromosome)])
    batch = data.collate(items[:4])
    assert batch["inputs"].shape[1] == int(batch["lengths"].max())
    for row, n in zip(batch["inputs"], batch["lengths"]):
        assert (row[n:] == data.vocab.pad_id).all() and (row[:n] >= 5).all()


def test_data_scarcity_pools(tmp_path):
    make_species(tmp_path, chroms=("1", "2", "4", "6", "5"), length=200)
    opts = dict(species="human,mouse", seq_len=8, samples_per_epoch=50, eval_samples=4, partial=True)
    ft = load_task("species", tmp_path, train_chromosomes=1, train_max_bases=20, **opts)
    assert ft.info["chromosomes"]["train"] == {"human": ["2"], "mouse": ["2"]}
    for i in range(50):
        region, start, end = ft.train.window(i)
        assert region.limit == 20 and end <= 20
    named = load_task("species", tmp_path, train_chromosomes="chr4,6", **opts)
    assert named.info["chromosomes"]["train"] == {"human": ["4", "6"], "mouse": ["4", "6"]}
    pre = load_task("species", tmp_path, train_chromosomes=1, train_max_bases=20, pool="pretrain", **opts)
    assert pre.info["chromosomes"]["train"] == {"human": ["4", "6"], "mouse": ["4", "6"]}
    assert all(pre.train.window(i)[0].limit > 20 for i in range(10))  # whole chromosomes
    assert pre.info["chromosomes"]["val"] == ft.info["chromosomes"]["val"]
    with pytest.raises(ConfigError, match="train_chromosomes: '3' is not a training chromosome of human"):
        load_task("species", tmp_path, train_chromosomes="3", **opts)
    with pytest.raises(ConfigError, match="pool='pretrain' needs train_chromosomes"):
        get_spec("species", pool="pretrain")


def test_missing_files(tmp_path):
    with pytest.raises(DataMissingError, match=r"species/human"):
        load_task("species", tmp_path)
    make_species(tmp_path)
    with pytest.raises(DataMissingError, match=r"human/chr6\.fa .*task\.options\.partial=true"):
        load_task("species", tmp_path, species="human,mouse")
    make_species(tmp_path / "other", chroms=("2", "5"))
    with pytest.raises(DataMissingError, match="no val chromosome of human"):
        load_task("species", tmp_path / "other", species="human,mouse", partial=True)


def test_bad_options():
    with pytest.raises(ConfigError, match="species"):
        get_spec("species", species="human,cat")
    with pytest.raises(ConfigError, match="seq_len"):
        get_spec("species", seq_len=0)
    with pytest.raises(ConfigError, match="pool"):
        get_spec("species", pool="everything", train_chromosomes=1)


def test_gz_decompressed_once_and_index_cached(tmp_path, monkeypatch):
    seqs = make_species(tmp_path, gz={("human", "2"), ("human", "1")})
    opts = dict(species="human,mouse", seq_len=16, samples_per_epoch=30, eval_samples=6, partial=True)
    data = load_task("species", tmp_path, **opts)
    plain = tmp_path / ".cache" / "species" / "human" / "chr2.fa"
    assert plain.is_file()
    region = next(r for r in data.train.regions[0] if r.chromosome == "2")
    assert region.path == str(plain)
    assert read_window(region.path, region.index, 0, region.limit) == seqs[("human", "2")].encode()
    mtime = plain.stat().st_mtime_ns
    import longrange.data.species as sp

    def fail(*_):
        raise AssertionError("indexed again")

    monkeypatch.setattr(sp, "index_fasta", fail)
    again = load_task("species", tmp_path, **opts)
    assert plain.stat().st_mtime_ns == mtime
    assert [again.train[i]["inputs"].tolist() for i in range(5)] == [data.train[i]["inputs"].tolist() for i in range(5)]
    (tmp_path / "species" / "mouse" / "chr4.fa").write_text(">x\nACGT\nAC!T\n")
    monkeypatch.undo()
    with pytest.raises(DataFormatError, match=r"mouse/chr4\.fa, line 3: invalid character '!'"):
        load_task("species", tmp_path, **opts)
    skipping = load_task("species", tmp_path, skip_bad=True, **opts)
    assert skipping.skipped == {str(tmp_path / "species" / "mouse" / "chr4.fa"): 1}
    assert skipping.info["chromosomes"]["train"]["mouse"] == ["2"]
