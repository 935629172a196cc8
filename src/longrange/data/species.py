"""DNA species classification (HyenaDNA's species task): which species does a DNA window come from?

Layout (one FASTA file per chromosome, as the HyenaDNA species loader expects)::

    <data_dir>/species/<species>/chr<name>.{fa,fna,fasta}[.gz]

for the five species ``human, lemur, mouse, pig, hippo`` (class ids in that order, or in the
order of the ``species`` option). Each file holds one sequence (one ``>`` header) with lines of a
uniform width (the last line may be shorter).

Chromosome splits follow the HyenaDNA species loader: validation chromosomes 1, 3, 12, 13; test
chromosomes 5, 7, 9, 10, 11; training the species' remaining chromosomes listed in
:data:`TRAIN_CHROMOSOMES` (e.g. human 2, 4, 6, 8, 14-22, X, Y). A listed chromosome without a
file is an error unless ``partial=True`` (then it is left out and named in ``TaskData.info``).

Sampling (deterministic): item ``i`` of a split draws, from ``numpy.random.default_rng([seed,
split, epoch, i])``, a species uniformly, then one of its chromosomes of the split uniformly, then a
start uniformly in ``[0, chromosome length)``; the window is ``[start, start + seq_len)`` cut at
the chromosome end, so windows near the end are shorter and the batch collation pads them with
``<pad>`` (and the padding mask covers them). Validation and test windows are fixed (epoch 0);
the training dataset has ``set_epoch(epoch)``, which the training loop calls before each epoch
to draw fresh windows. Split sizes: ``samples_per_epoch`` training items, ``eval_samples`` items
for validation and for test.

Tokens: characters ``A, C, G, T, N`` (ids 5..9 after the five specials). Lower-case (soft-masked)
bases are upper-cased; the other IUPAC letters (R, Y, K, M, S, W, B, D, H, V, U) become ``N``.
Any other character in a sequence line is an error naming the file and line.

Data-scarcity options (thesis section 16.5): ``train_chromosomes`` restricts training to a
number ``k`` of each species' training chromosomes (the first ``k`` of its list) or to named
chromosomes (``"2,4"``); ``train_max_bases`` keeps only the first K bases of each of them.
``pool="pretrain"`` selects the complementary pretraining pool instead: the training chromosomes
*not* chosen by ``train_chromosomes`` (whole), leaving validation and test unchanged.

With ``skip_bad=True`` a malformed FASTA file is left out whole and counted in
``TaskData.skipped``.

Files are read lazily: each FASTA is indexed once (offset of the sequence, line width, length),
the index cached in ``<data_dir>/.cache``, and a window is read by seeking. ``.gz`` files are
decompressed once into ``<data_dir>/.cache/species/<species>/`` (redone when the archive's size or
modification time changes).
"""

from __future__ import annotations

import gzip
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from longrange.data.tokenize import FIRST_TOKEN_ID, Vocabulary
from longrange.errors import ConfigError, DataFormatError, DataMissingError

SPECIES = ("human", "lemur", "mouse", "pig", "hippo")
VAL_CHROMOSOMES = ("1", "3", "12", "13")
TEST_CHROMOSOMES = ("5", "7", "9", "10", "11")
_AUTOSOMES_FROM_14 = lambda last: tuple(str(i) for i in range(14, last + 1))  # noqa: E731
TRAIN_CHROMOSOMES = {
    "human": ("2", "4", "6", "8", *_AUTOSOMES_FROM_14(22), "X", "Y"),
    "lemur": ("2", "4", "6", "8", *_AUTOSOMES_FROM_14(27), "X", "Y"),
    "mouse": ("2", "4", "6", "8", *_AUTOSOMES_FROM_14(19), "X"),
    "pig": ("2", "4", "6", "8", *_AUTOSOMES_FROM_14(18), "X", "Y"),
    "hippo": ("2", "4", "6", "8", *_AUTOSOMES_FROM_14(17), "X"),
}
ALPHABET = ("A", "C", "G", "T", "N")
SUFFIXES = (".fa", ".fna", ".fasta")
_SPLIT_CODES = {"train": 0, "val": 1, "test": 2}
OBTAIN = (
    "download per-chromosome FASTA files (e.g. UCSC/NCBI assemblies hg38, Mmur_3.0 (lemur), mm10, susScr11 (pig), "
    "hippo) as used by HyenaDNA's species task into <data_dir>/species/<species>/chr<name>.fa[.gz]"
)

# byte -> canonical base (upper-cased, IUPAC ambiguity codes -> N); 0 marks an invalid byte
_CANON = bytearray(256)
for _c in b"ACGTN":
    _CANON[_c] = _c
    _CANON[_c + 32] = _c
for _c in b"RYKMSWBDHVU":
    _CANON[_c] = ord("N")
    _CANON[_c + 32] = ord("N")
_CANON_TABLE = bytes(_CANON)
_VALID_BYTES = bytes(i for i in range(256) if _CANON[i])
# canonical base -> token id
_IDS = np.zeros(256, dtype=np.int64)
for _i, _c in enumerate(b"ACGTN"):
    _IDS[_c] = FIRST_TOKEN_ID + _i


# ------------------------------------------------------------------------------------------------
# FASTA index and windows
# ------------------------------------------------------------------------------------------------
def index_fasta(path: str | Path) -> dict[str, int]:
    """Index a single-sequence FASTA file.

    Returns ``{"offset": byte offset of the first sequence line, "line_bases": bases per full line,
    "line_bytes": bytes per full line including its line ending, "length": total bases}``.
    Raises DataFormatError naming the file and line for a malformed header, a second header, a
    character outside the nucleotide/IUPAC letters, or lines of non-uniform width.
    """
    path = Path(path)
    with open(path, "rb") as f:
        header = f.readline()
        if not header.startswith(b">") or not header[1:].strip():
            raise DataFormatError("malformed FASTA header: the first line must be '>' followed by a name", path, 1)
        offset = f.tell()
        width = line_bytes = None
        length = 0
        line_no = 1
        short_line = blank_line = None
        for raw in f:
            line_no += 1
            body = raw.rstrip(b"\r\n")
            if raw.startswith(b">"):
                raise DataFormatError(
                    "a second sequence header: expected one sequence per chromosome file", path, line_no
                )
            if not body:
                blank_line = blank_line or line_no
                continue
            if blank_line is not None:
                raise DataFormatError(f"sequence continues after the blank line {blank_line}", path, line_no)
            bad = body.translate(None, _VALID_BYTES)
            if bad:
                raise DataFormatError(f"invalid character {chr(bad[0])!r} in a sequence line", path, line_no)
            if width is None:
                width, line_bytes = len(body), len(raw)
            elif short_line is not None:
                raise DataFormatError(
                    f"non-uniform line width: line {short_line} is shorter than the {width} bases of the lines "
                    "before it but is not the last line",
                    path,
                    line_no,
                )
            elif len(body) > width or (len(body) == width and len(raw) != line_bytes and raw.endswith(b"\n")):
                raise DataFormatError(f"non-uniform line width: {len(body)} bases, expected {width}", path, line_no)
            if len(body) < width:
                short_line = line_no
            length += len(body)
    if not length:
        raise DataFormatError("the sequence is empty", path)
    return {"offset": offset, "line_bases": width, "line_bytes": line_bytes, "length": length}


def read_window(path: str | Path, index: dict[str, int], start: int, end: int) -> bytes:
    """Canonical bases ``[start, end)`` (0-based, ``end`` <= length) of an indexed FASTA, by seeking."""
    if not 0 <= start <= end <= index["length"]:
        raise ValueError(f"window [{start}, {end}) outside the sequence of length {index['length']} in {path}")
    if start == end:
        return b""
    w, lb, off = index["line_bases"], index["line_bytes"], index["offset"]
    first = off + (start // w) * lb + start % w
    last = off + ((end - 1) // w) * lb + (end - 1) % w
    with open(path, "rb") as f:
        f.seek(first)
        raw = f.read(last - first + 1)
    seq = raw.replace(b"\n", b"").replace(b"\r", b"")
    if len(seq) != end - start:
        raise DataFormatError(
            f"read {len(seq)} bases for window [{start}, {end}); the file changed since it was indexed", path
        )
    return seq.translate(_CANON_TABLE)


def encode_bases(seq: bytes) -> torch.Tensor:
    """Token ids (LongTensor) of canonical bases: A, C, G, T, N -> 5..9."""
    return torch.from_numpy(_IDS[np.frombuffer(seq, dtype=np.uint8)])


def decompress_once(gz_path: Path, out_path: Path) -> Path:
    """Decompress ``gz_path`` to ``out_path`` unless an up-to-date copy exists (stamp: size, mtime)."""
    st = gz_path.stat()
    stamp = f"{gz_path.resolve()} {st.st_size} {st.st_mtime_ns}"
    stamp_path = out_path.with_name(out_path.name + ".source")
    if out_path.is_file() and stamp_path.is_file() and stamp_path.read_text() == stamp:
        return out_path
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=out_path.name + ".", suffix=".tmp", dir=out_path.parent)
    try:
        with os.fdopen(fd, "wb") as out, gzip.open(gz_path, "rb") as src:
            shutil.copyfileobj(src, out, length=1 << 22)
        os.replace(tmp, out_path)
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise DataFormatError(f"cannot decompress ({type(exc).__name__}: {exc})", gz_path) from exc
    stamp_path.write_text(stamp)
    return out_path


def find_chromosome_file(species_dir: Path, chromosome: str) -> Path | None:
    for suffix in SUFFIXES:
        for name in (f"chr{chromosome}{suffix}", f"chr{chromosome}{suffix}.gz"):
            if (species_dir / name).is_file():
                return species_dir / name
    return None


@dataclass(frozen=True)
class Region:
    """The sampled part of one chromosome: bases ``[0, limit)`` of ``path`` (species class ``label``)."""

    label: int
    species: str
    chromosome: str
    path: str
    index: dict
    limit: int


class SpeciesWindows(Dataset):
    """Random DNA windows, deterministic for (seed, split, epoch, index); see the module docstring.

    Items: ``{"inputs": LongTensor (n,) with n <= seq_len, "target": LongTensor () species id}``.
    """

    def __init__(self, regions: list[list[Region]], seq_len: int, n_samples: int, seed: int, split: str):
        if any(not r for r in regions):
            raise ValueError("every species needs at least one region")
        self.regions, self.seq_len, self.n_samples = regions, int(seq_len), int(n_samples)
        self.seed, self.split_code, self.epoch = int(seed), _SPLIT_CODES[split], 0
        self.split = split

    def set_epoch(self, epoch: int) -> None:
        """Draw the training windows of ``epoch`` (held-out splits ignore this)."""
        if self.split == "train":
            self.epoch = int(epoch)

    def __len__(self) -> int:
        return self.n_samples

    def window(self, i: int) -> tuple[Region, int, int]:
        """The region and ``[start, end)`` of item ``i`` in the current epoch."""
        if not 0 <= i < self.n_samples:
            raise IndexError(f"index {i} out of range for {self.n_samples} samples")
        rng = np.random.default_rng([self.seed, self.split_code, self.epoch, i])
        pool = self.regions[int(rng.integers(len(self.regions)))]
        region = pool[int(rng.integers(len(pool)))]
        start = int(rng.integers(region.limit))
        return region, start, min(start + self.seq_len, region.limit)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        region, start, end = self.window(i)
        seq = read_window(region.path, region.index, start, end)
        return {"inputs": encode_bases(seq), "target": torch.tensor(region.label, dtype=torch.long)}


# ------------------------------------------------------------------------------------------------
# task
# ------------------------------------------------------------------------------------------------
_DEFAULTS = {
    "seq_len": 1024,
    "species": ",".join(SPECIES),
    "samples_per_epoch": 8192,
    "eval_samples": 1024,
    "train_chromosomes": None,
    "train_max_bases": None,
    "pool": "finetune",
    "partial": False,
}


def _species_list(species) -> list[str]:
    names = [s.strip() for s in species.split(",")] if isinstance(species, str) else list(species)
    unknown = [s for s in names if s not in SPECIES]
    if unknown or len(names) < 2 or len(set(names)) != len(names):
        raise ConfigError(f"species: expected at least two distinct names from {', '.join(SPECIES)}, got {species!r}")
    return names


def _positive(name: str, value, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}: must be a positive integer{' or None' if allow_none else ''}, got {value!r}")
    return value


def _select_train(species: str, available: list[str], train_chromosomes) -> list[str]:
    """The finetuning chromosomes of one species chosen by ``train_chromosomes``."""
    if train_chromosomes is None:
        return list(available)
    if isinstance(train_chromosomes, int) and not isinstance(train_chromosomes, bool):
        if train_chromosomes < 1:
            raise ConfigError(f"train_chromosomes: must be >= 1, got {train_chromosomes}")
        return list(available[:train_chromosomes])
    names = [c.strip().removeprefix("chr") for c in str(train_chromosomes).split(",") if c.strip()]
    bad = [c for c in names if c not in TRAIN_CHROMOSOMES[species]]
    if bad:
        raise ConfigError(
            f"train_chromosomes: {bad[0]!r} is not a training chromosome of {species} "
            f"({', '.join(TRAIN_CHROMOSOMES[species])})"
        )
    return [c for c in available if c in names]


def species_spec(
    seq_len=1024,
    species=",".join(SPECIES),
    samples_per_epoch=8192,
    eval_samples=1024,
    train_chromosomes=None,
    train_max_bases=None,
    pool="finetune",
    partial=False,
):
    from longrange.data.spec import TaskSpec

    names = _species_list(species)
    _positive("seq_len", seq_len)
    _positive("samples_per_epoch", samples_per_epoch)
    _positive("eval_samples", eval_samples)
    _positive("train_max_bases", train_max_bases, allow_none=True)
    if pool not in ("finetune", "pretrain"):
        raise ConfigError(f"pool: must be 'finetune' or 'pretrain', got {pool!r}")
    if pool == "pretrain" and train_chromosomes is None:
        raise ConfigError(
            "pool='pretrain' needs train_chromosomes (the pretraining pool is the training "
            "chromosomes not used for finetuning)"
        )
    return TaskSpec(
        name="species",
        input_kind="tokens",
        seq_len=int(seq_len),
        n_classes=len(names),
        metric="accuracy",
        mask_ratio=0.15,
        description=f"DNA species classification ({', '.join(names)}), random windows of {seq_len} bases",
        layout="species/<species>/chr<name>.{fa,fna,fasta}[.gz]",
        obtain=OBTAIN,
    )


def _plain_file(data_dir: Path, species: str, path: Path) -> Path:
    if path.suffix != ".gz":
        return path
    from longrange.data.cache import cache_dir

    return decompress_once(path, cache_dir(data_dir) / "species" / species / path.name[:-3])


def _region(data_dir: Path, label: int, species: str, chromosome: str, path: Path, max_bases: int | None) -> Region:
    from longrange.data.cache import cached

    plain = _plain_file(data_dir, species, path)
    index = cached(
        data_dir, f"species-index-{species}-chr{chromosome}", [plain], {}, lambda: index_fasta(plain), quiet=True
    )
    limit = index["length"] if max_bases is None else min(index["length"], max_bases)
    return Region(label, species, chromosome, str(plain), dict(index), int(limit))


def load_species(
    data_dir: Path,
    spec,
    seed: int = 0,
    skip_bad: bool = False,
    seq_len=1024,
    species=",".join(SPECIES),
    samples_per_epoch=8192,
    eval_samples=1024,
    train_chromosomes=None,
    train_max_bases=None,
    pool="finetune",
    partial=False,
):
    """Load the species task as TaskData (see the module docstring)."""
    from longrange.data.dataset import TaskData

    names = _species_list(species)
    root = Path(data_dir) / "species"
    missing: list[str] = []
    skipped: dict[str, int] = {}
    regions: dict[str, list[list[Region]]] = {"train": [], "val": [], "test": []}
    for label, sp in enumerate(names):
        sp_dir = root / sp
        if not sp_dir.is_dir():
            raise DataMissingError(f"missing species directory {sp_dir}; {OBTAIN}")
        found: dict[str, Path] = {}
        for chrom in (*TRAIN_CHROMOSOMES[sp], *VAL_CHROMOSOMES, *TEST_CHROMOSOMES):
            path = find_chromosome_file(sp_dir, chrom)
            if path is None:
                missing.append(str(sp_dir / f"chr{chrom}.fa"))
            else:
                found[chrom] = path
        if missing and not partial:
            raise DataMissingError(
                f"missing chromosome file {missing[0]} (or .fna/.fasta, optionally .gz); "
                "set the task option partial (task.options.partial=true; `longrange data` commands: -o partial=true) "
                f"to use the chromosomes present; {OBTAIN}"
            )
        train_avail = [c for c in TRAIN_CHROMOSOMES[sp] if c in found]
        chosen = _select_train(sp, train_avail, train_chromosomes)
        if pool == "pretrain":
            train_set, max_bases = [c for c in train_avail if c not in chosen], None
        else:
            train_set, max_bases = chosen, train_max_bases
        per_split = {
            "train": train_set,
            "val": [c for c in VAL_CHROMOSOMES if c in found],
            "test": [c for c in TEST_CHROMOSOMES if c in found],
        }
        for split, chroms in per_split.items():
            pool_regions = []
            for c in chroms:
                try:
                    pool_regions.append(
                        _region(Path(data_dir), label, sp, c, found[c], max_bases if split == "train" else None)
                    )
                except DataFormatError as err:
                    # a malformed file is dropped whole (with skip_bad), as one bad record
                    if not skip_bad:
                        raise
                    skipped[str(err.path)] = skipped.get(str(err.path), 0) + 1
            if not pool_regions:
                raise DataMissingError(
                    f"no {split} chromosome of {sp} under {sp_dir} "
                    f"(expected one of {', '.join(chroms or _split_defaults(sp, split, pool))}); {OBTAIN}"
                )
            regions[split].append(pool_regions)
    sizes = {"train": samples_per_epoch, "val": eval_samples, "test": eval_samples}
    parts = {s: SpeciesWindows(regions[s], seq_len, sizes[s], seed, s) for s in regions}
    info = {
        "missing": missing,
        "chromosomes": {
            s: {names[i]: [r.chromosome for r in pool_] for i, pool_ in enumerate(regions[s])} for s in regions
        },
    }
    return TaskData(
        spec=spec,
        train=parts["train"],
        val=parts["val"],
        test=parts["test"],
        vocab=Vocabulary(list(ALPHABET), strict=True),
        skipped=skipped,
        info=info,
    )


def _split_defaults(species: str, split: str, pool: str) -> tuple[str, ...]:
    if split == "val":
        return VAL_CHROMOSOMES
    if split == "test":
        return TEST_CHROMOSOMES
    return TRAIN_CHROMOSOMES[species]


def expected_paths(data_dir: Path, species=",".join(SPECIES), **_) -> list[Path]:
    return [Path(data_dir) / "species" / s for s in _species_list(species)]


def _register() -> None:
    from longrange.data.registry import register_task

    register_task(
        "species",
        species_spec,
        lambda data_dir, spec, seed=0, skip_bad=False, **o: load_species(data_dir, spec, seed, skip_bad, **o),
        dict(_DEFAULTS),
        expected=expected_paths,
    )


_register()
