"""docs/reliability.md names, for every case, the tests that hold it: each of them exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_test_named_in_the_reliability_table_exists():
    text = (ROOT / "docs" / "reliability.md").read_text()
    refs = set(re.findall(r"(tests/[\w/]+\.py)::(\w+)", text))
    assert len(refs) > 40
    missing = [
        f"{f}::{name}"
        for f, name in sorted(refs)
        if not (ROOT / f).is_file() or not re.search(rf"^def {name}\(", (ROOT / f).read_text(), re.M)
    ]
    assert missing == []
