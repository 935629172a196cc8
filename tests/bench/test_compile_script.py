"""``benchmarks/compile.py`` runs end to end (no timings asserted): a preset's eager and compiled
steps in a process of their own, and the Mamba backbone beside a stand-in for mamba.py's package.
Inductor compiles a model per run (tens of seconds on a loaded CPU), hence ``-m slow``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import repo_scripts
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "compile.py"

#: A stand-in with mamba.py's interface: ``Mamba(MambaConfig(d_model, n_layers))`` on (B, L, D).
FAKE_MAMBA = """
from dataclasses import dataclass
import torch

@dataclass
class MambaConfig:
    d_model: int
    n_layers: int

class Mamba(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(config.d_model, config.d_model) for _ in range(config.n_layers))

    def forward(self, x):
        for layer in self.layers:
            x = x + torch.tanh(layer(x))
        return x
"""


def _module():
    return repo_scripts.load(SCRIPT, "compile_benchmark")


@pytest.mark.slow
def test_compile_benchmark_runs_a_preset_and_the_mamba_comparison(tmp_path, monkeypatch, capsys):
    module = _module()
    threads = torch.get_num_threads()
    try:
        out = tmp_path / "presets.json"
        result = module.main(
            ["--presets", "demo/dlr", "nonexistent/preset", "--batch-size", "2", "--steps", "1", "--json", str(out)]
        )
        rows = {r["preset"]: r for r in result["rows"]}
        assert rows["demo/dlr"]["speedup_cpu"] > 0 and rows["demo/dlr"]["batch"] == 2
        assert "error" in rows["nonexistent/preset"]  # recorded, not skipped
        assert json.loads(out.read_text())["environment"]["threads"] == 1
        assert "| demo/dlr | simple-dlr | train (supervised) | 2 x 128 |" in capsys.readouterr().out

        fake = tmp_path / "mamba.py"
        (fake / "mambapy").mkdir(parents=True)
        (fake / "mambapy" / "__init__.py").write_text("")
        (fake / "mambapy" / "mamba.py").write_text(FAKE_MAMBA)
        monkeypatch.setattr(sys, "path", list(sys.path))
        result = module.main(
            [
                "--mamba-py",
                str(fake),
                "--mamba-batch",
                "1",
                "--mamba-length",
                "16",
                "--mamba-width",
                "16",
                "--mamba-layers",
                "1",
                "--steps",
                "1",
            ]
        )
        assert (
            set(result["rows"]) == {"eager", "compiled", module.NO_ONEDNN, "mamba.py"} and result["ratio_compiled"] > 0
        )
        assert {g["product"] for g in result["matrix_products"]} >= {"in_proj", "out_proj"}
        assert result["goal"] == 20.0 and "goal 20x" in capsys.readouterr().out
        with pytest.raises(SystemExit, match="no mambapy/mamba.py"):
            module.main(["--mamba-py", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)
