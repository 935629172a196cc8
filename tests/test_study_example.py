"""docs/study.md: the study of one's own (two presets and a plugin primitive at matched parameter
counts over 3 seeds), its plugin, its one command (planned here; run whole as a slow test), and its
committed report."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest
import torch

from longrange import registry as registry_module
from longrange.cli import main

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "study.md"
EXAMPLE = ROOT / "docs" / "examples" / "study"


def study_command(page: Path = PAGE) -> tuple[dict[str, str], list[str]]:
    """The environment and the arguments of the page's `longrange compare` command (the study's)."""
    blocks = re.findall(r"```bash\n(.*?)```", page.read_text(), re.S)
    text = next(b for b in blocks if "LONGRANGE_PLUGINS=longconv longrange compare" in b).replace("\\\n", " ")
    words = shlex.split(text)
    env = {}
    while "=" in words[0]:
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    assert words[:2] == ["longrange", "compare"]
    return env, words[1:]


@pytest.fixture
def plugin(monkeypatch):
    env, args = study_command()
    assert env == {"PYTHONPATH": "docs/examples/study", "LONGRANGE_PLUGINS": "longconv"}
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT / env["PYTHONPATH"]))
    monkeypatch.setenv("LONGRANGE_PLUGINS", env["LONGRANGE_PLUGINS"])
    monkeypatch.setattr(registry_module, "_plugins_loaded", set())
    yield args
    from longrange.layers import PRIMITIVES

    PRIMITIVES.unregister("longconv")
    sys.modules.pop("longconv", None)


def test_the_plugin_convolves_as_its_reference(plugin):
    from longrange.layers import PRIMITIVES
    from longrange.ops.fftconv import fft_conv_ref

    torch.manual_seed(0)
    for bidirectional in (False, True):
        layer = PRIMITIVES.build("longconv", 6, bidirectional=bidirectional, length=8).double()
        x = torch.randn(2, 11, 6, dtype=torch.float64)
        k = layer.kernel(11)
        assert k.shape == (2 if bidirectional else 1, 6, 11) and (k[..., 8:] == 0).all()
        want = fft_conv_ref(x.transpose(1, 2), k if bidirectional else k[0], layer.D).transpose(1, 2)
        torch.testing.assert_close(layer(x), want)


def test_the_study_command_plans_three_matched_models(plugin, tmp_path, capsys):
    out = plugin.index("--out")
    args = plugin[: out + 1] + [str(tmp_path / "study")] + plugin[out + 2 :]
    assert main(args + ["--dry-run", "--data-dir", str(tmp_path / "data")]) == 0
    text = capsys.readouterr().out
    assert text.startswith("36 stages in 3 dependency levels")  # 3 models x 3 seeds x 4 stages
    assert "listops/LongConv/masked-spt/seed2/finetune" in text
    matched = re.findall(
        r"matched to Transformer: (\S+): model.d_model 64 -> \d+: [\d,]+ parameters \(([-+][\d.]+)%", text
    )
    assert [m[0] for m in matched] == ["S4D", "LongConv"] and all(abs(float(m[1])) < 1.0 for m in matched)
    assert "warning" not in text


def test_the_readme_shows_the_same_command_and_links_the_committed_report():
    readme = ROOT / "README.md"
    env, args = study_command(readme)
    assert (env, args) == study_command()
    out = args[args.index("--out") + 1]  # the committed report is this command's: 3 models x 3 seeds x 4 stages
    assert f"36 finished runs under {out}." in (EXAMPLE / "report" / "report.md").read_text()
    assert "](docs/examples/study/report/report.md)" in readme.read_text() and "](docs/study.md)" in readme.read_text()


def test_the_committed_report_has_its_plots():
    report = (EXAMPLE / "report" / "report.md").read_text()
    images = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", report)
    assert "learning_curves.png" in images and "bars.png" in images
    assert all((EXAMPLE / "report" / name).is_file() for name in images)
    for row in ("Transformer", "S4D + masked SPT", "LongConv (scratch, matched compute)"):
        assert f"| {row} |" in report
    assert "Holm-adjusted p" in report
    assert not list(EXAMPLE.rglob("*.pt")) and not list(EXAMPLE.rglob("*.safetensors"))  # no checkpoints


@pytest.mark.slow
def test_the_study_runs_as_documented(plugin, tmp_path, capsys):
    out = plugin.index("--out")
    args = plugin[: out + 1] + [str(tmp_path / "study")] + plugin[out + 2 :]
    assert main(args + ["--data-dir", str(tmp_path / "data")]) == 0
    assert "Holm-adjusted over the 6 comparisons above" in capsys.readouterr().out
    assert (tmp_path / "study" / "report.md").is_file()
