"""The built-in demo: its wiring on a tiny data set (fast), and end to end (about ten minutes on 2 CPU
cores: marked slow, run with -m slow)."""
from __future__ import annotations

import re

import pytest

from longrange.cli import main
from longrange.experiment import demo
from longrange.experiment.config import resolve


def test_demo_presets_are_the_study_setting():
    """The demo runs the setting benchmarks/small_scale_spt.py selected, field by field."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[2] / "benchmarks" / "small_scale_spt.py"
    spec = importlib.util.spec_from_file_location("small_scale_spt", path)
    study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(study)
    setting = study.SETTINGS[demo.DEMO_SETTING]
    data = dict(study.DATASETS[setting["data"]])
    from longrange.data.tasks import generator

    generate = resolve(demo.DEMO_PRESETS[0]).task.generate  # the generated data: the study's, option by option
    options = generator("listops").options(generate["config"], {k: v for k, v in generate.items() if k != "config"},
                                           "listops")
    assert {"kind": "listops", **options} == {**data, "seed": 0}
    # the screen's seeds and more (the study confirmed the setting with all of them on validation)
    assert set(study.SEEDS) <= set(demo.DEMO_SEEDS) and len(demo.DEMO_SEEDS) >= 3
    assert resolve(demo.DEMO_PRESETS[0]).compare.seeds == list(demo.DEMO_SEEDS)
    (name,) = demo.DEMO_PRESETS
    exp = resolve(name)
    want = setting["experiment"]
    assert exp.label == want["label"]
    assert exp.task.name == want["task"]["name"] and exp.task.options == want["task"]["options"]
    assert exp.task.train_subset == want["task"]["train_subset"]
    model = {k: getattr(exp.model, k) for k in want["model"]}
    assert model == want["model"]
    assert {k: exp.train[k] for k in want["train"] if k != "progress"} == {
        k: v for k, v in want["train"].items() if k != "progress"}
    assert exp.pretrain == want["pretrain"]
    assert exp.objective.mask_ratio == (want["objective"].get("mask_ratio") or 0.1)
    assert exp.compare.objectives == want["compare"]["objectives"] and exp.compare.compute_matched


def test_demo_prints_the_table_and_the_computed_verdict(tmp_path, monkeypatch):
    """On a tiny generated ListOps: the table has every regime, the verdict is the one computed from the
    paired seeds, and the report has the plots and the kernel decay analysis."""
    tiny = "{config: short, n_train: 80, n_val: 16, n_test: 16, min_length: 8, max_length: 32, max_depth: 3, max_args: 3}"
    text = demo.run_demo(tmp_path, seeds=[0, 1], jobs=1,
                         overrides=[f"task.generate={tiny}", "train.epochs=1", "pretrain.epochs=1", "train.batch_size=4",
                                    "task.options.seq_len=32", "model.d_model=8", "model.d_state=4"])
    label = resolve(demo.DEMO_PRESETS[0]).label
    for row in (label, f"{label} (scratch, matched compute)", f"{label} + masked SPT"):
        assert f"| {row} |" in text
    assert "Verdict (SPT minus scratch, paired by seed, 95% CI Student t):" in text
    from longrange.report import collect_runs
    from longrange.report.verdict import comparisons

    found = comparisons(collect_runs([tmp_path], warn=lambda m: None))
    assert [c.baseline for c in found] == ["scratch", "scratch-matched"]
    for c in found:
        assert f"{c.title}: {c.sentence()}" in text and c.stat.n == 2
    report = (tmp_path / "report.md").read_text()
    assert "## Verdict" in report and "## Convolution kernel decay" in report
    assert re.search(r"!\[kernel decay, listops, [^\]]+\]\(kernels_listops_[a-z-]+\.png\)", report)
    assert (tmp_path / "learning_curves.png").is_file()


@pytest.mark.slow
def test_demo_runs_the_comparison_and_writes_the_report(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    label = resolve(demo.DEMO_PRESETS[0]).label
    for row in (label, f"{label} + masked SPT"):
        assert f"| {row} |" in out
    assert "Verdict (SPT minus scratch" in out
    assert (tmp_path / "report.md").is_file()
    assert list(tmp_path.glob("kernels_*.png"))
