"""``longrange params``: the thesis' Table 3 parameter counts (a command module of the experiment layer)."""
from __future__ import annotations

from longrange.cli import COMMAND_MODULES, main


def test_params_prints_the_table3_counts(capsys):
    assert "longrange.experiment.params_cli" in COMMAND_MODULES
    assert main(["params"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "| model | total | in primitives | % in primitives |"
    assert out[2:] == [
        "| Mamba-S6 | 585.7k | 91.9k | 16% |",
        "| Mamba-S4D | 563.4k | 69.6k | 12% |",
        "| Mamba-S4 | 585.7k | 91.9k | 16% |",
        "| Simple-S4D | 551.1k | 197.9k | 36% |",
        "| Simple-S4 | 616.4k | 263.2k | 43% |",
    ]
