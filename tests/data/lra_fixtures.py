"""Fixture writers: tiny data sets in the exact published layouts (imported by the data tests as
``from lra_fixtures import ...``: a module name of its own, so that the tests of several folders
collect together, which a ``from conftest import`` does not allow)."""

from __future__ import annotations

from pathlib import Path


def write_listops(
    folder: Path, splits: dict[str, list[str]] | None = None, header: str = "Source\tTarget", newline: str = "\r\n"
) -> Path:
    """Write ``basic_{train,val,test}.tsv``; each split is a list of raw lines after the header."""
    default = ["( ( ( [MAX 4 ) 5 ) ] )\t5", "( ( ( [SM 4 ) 7 ) ] )\t1", "3\t3"]
    splits = splits or {}
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "val", "test"):
        lines = [header] + splits.get(split, default)
        (folder / f"basic_{split}.tsv").write_bytes("".join(line + newline for line in lines).encode())
    return folder


def write_imdb(root: Path, docs: dict[str, dict[str, list[str]]]) -> Path:
    """Write ``aclImdb/{train,test}/{pos,neg}/<i>_<rating>.txt`` under ``root``."""
    for split, by_label in docs.items():
        for label, texts in by_label.items():
            folder = root / "aclImdb" / split / label
            folder.mkdir(parents=True, exist_ok=True)
            for i, text in enumerate(texts):
                rating = 8 if label == "pos" else 2
                (folder / f"{i}_{rating}.txt").write_text(text, encoding="utf-8")
    return root


def write_aan(folder: Path, splits: dict[str, list[str]]) -> Path:
    """Write ``new_aan_pairs.{train,eval,test}.tsv`` (no header); each split is a list of raw lines."""
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "eval", "test"):
        lines = splits[split]
        (folder / f"new_aan_pairs.{split}.tsv").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return folder
