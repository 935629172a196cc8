"""The built-in demo, end to end (about ten minutes on 2 CPU cores: marked slow, run with -m slow)."""
from __future__ import annotations

import pytest

from longrange.cli import main


@pytest.mark.slow
def test_demo_runs_the_comparison_and_writes_the_report(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for row in ("Transformer", "Transformer + masked SPT", "S4D", "S4D + masked SPT"):
        assert f"| {row} |" in out
    assert (tmp_path / "report.md").is_file()
    assert list(tmp_path.glob("*.png"))
