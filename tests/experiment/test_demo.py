"""The built-in demos: their presets are their studies' settings, their wiring on tiny data (fast), and
end to end (minutes on 2 CPU cores: marked slow, run with -m slow)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import repo_scripts

from longrange.cli import main
from longrange.experiment import demo
from longrange.experiment.config import resolve

ROOT = Path(__file__).parents[2]


def _study(script: str):
    return repo_scripts.load(ROOT / script)


def _without_progress(train: dict) -> dict:
    return {k: v for k, v in train.items() if k != "progress"}


def test_recall_demo_presets_are_the_study_setting():
    """The recall demo runs a part of ar-small-recall3's grid with its settings, field by field: each
    model's task, model, training and pretraining, one of its label counts, one of its objectives."""
    d = demo.DEMOS["recall"]
    assert d is demo.DEMOS[demo.DEFAULT_DEMO] and demo.DEMO_PRESETS == d.presets
    study = _study(d.study)
    setting = study.SETTINGS[d.setting]
    want = {e.label: e for e in study.experiments(d.setting, list(d.seeds))}
    assert len(d.presets) >= 2 and len(d.seeds) >= 3
    for name in d.presets:
        exp = resolve(name)
        w = want[exp.label]
        assert exp.task == w.task and exp.model == w.model
        assert _without_progress(exp.train) == _without_progress(w.train) and exp.pretrain == w.pretrain
        assert exp.objective == w.objective
        c = exp.compare
        assert c.seeds == list(d.seeds) and c.pretrain_data == setting["pretrain_data"]
        assert set(c.train_subsets) <= set(setting["labels"]) and set(c.objectives) <= set(setting["objectives"])
        assert "causal" in c.objectives
    # from scratch the DLR is the better one at 1,000 labels, after causal SPT the Transformer
    assert {resolve(n).label for n in d.presets} == {"Transformer", "DLR"} and c.train_subsets == [250, 1000]


def test_listops_demo_presets_are_the_study_setting():
    """The ListOps demo runs the setting benchmarks/small_scale_spt.py selected, field by field."""
    d = demo.DEMOS["listops"]
    study = _study(d.study)
    setting = study.SETTINGS[d.setting]
    data = dict(study.DATASETS[setting["data"]])
    from longrange.data.tasks import generator

    (name,) = d.presets
    exp = resolve(name)
    generate = exp.task.generate  # the generated data: the study's, option by option
    options = generator("listops").options(
        generate["config"], {k: v for k, v in generate.items() if k != "config"}, "listops"
    )
    assert {"kind": "listops", **options} == {**data, "seed": 0}
    # the screen's seeds and more (the study confirmed the setting with all of them on validation)
    assert set(study.SEEDS) <= set(d.seeds) and len(d.seeds) >= 3
    assert exp.compare.seeds == list(d.seeds)
    want = setting["experiment"]
    assert exp.label == want["label"]
    assert exp.task.name == want["task"]["name"] and exp.task.options == want["task"]["options"]
    assert exp.task.train_subset == want["task"]["train_subset"]
    model = {k: getattr(exp.model, k) for k in want["model"]}
    assert model == want["model"]
    assert {k: exp.train[k] for k in _without_progress(want["train"])} == _without_progress(want["train"])
    assert exp.pretrain == want["pretrain"]
    assert exp.objective.mask_ratio == (want["objective"].get("mask_ratio") or 0.1)
    assert exp.compare.objectives == want["compare"]["objectives"] and exp.compare.compute_matched


TINY_RECALL = [
    "task.options.n_train=64",
    "task.options.n_val=16",
    "task.options.n_test=16",
    "compare.train_subsets=[16]",
    "train.max_steps=3",
    "pretrain.max_steps=3",
    "train.batch_size=8",
    "model.d_model=8",
    "train.eval_every=0",
    "pretrain.eval_every=0",
]


def test_recall_demo_prints_the_table_verdict_and_ranking(tmp_path, capsys):
    """On a tiny associative recall: a table row per model and regime, the verdict per model computed from
    the paired seeds, and the ranking of the models from scratch and after SPT."""
    text = demo.run_demo(tmp_path, seeds=[0, 1], jobs=1, overrides=TINY_RECALL)
    # The models' sizes differ on purpose, and the demo says why instead of warning about itself.
    assert text.startswith("Model sizes: the models are the recall study's, at the width (64)")
    assert "ar-small-recall3-pmatch" in text
    labels = [resolve(name).label for name in demo.DEMO_PRESETS]
    for label in labels:
        assert f"| {label} |" in text and f"| {label} + causal SPT" in text
    assert "matched compute" not in text  # the demo leaves the compute-matched baseline out
    from longrange.report import collect_runs
    from longrange.report.verdict import comparisons

    found = comparisons(collect_runs([tmp_path], warn=lambda m: None))
    assert sorted(c.label for c in found) == sorted(labels) and {c.baseline for c in found} == {"scratch"}
    for c in found:
        assert f"{c.title}: {c.sentence()}" in text and c.stat.n == 2
    ranking = text[text.index("Ranking of the models by mean") :].splitlines()
    assert ranking[1].startswith("  scratch: ") and ranking[2].startswith("  causal-spt-all: ")
    assert set(ranking[1].split(": ")[1].split(" (")[0].split(" > ")) == set(labels)
    report = (tmp_path / "report.md").read_text()
    assert "## Verdict" in report and "## Ranking of the models under each regime" in report
    printed = capsys.readouterr()
    assert "sizes differ on purpose: the models are the recall study's" in printed.out + printed.err
    assert "warning: the compared models differ in size" not in printed.out + printed.err


def test_listops_demo_prints_the_table_and_the_computed_verdict(tmp_path):
    """On a tiny generated ListOps: the table has every regime, the verdict is the one computed from the
    paired seeds, and the report has the plots and the kernel decay analysis."""
    tiny = (
        "{config: short, n_train: 80, n_val: 16, n_test: 16, min_length: 8, max_length: 32, max_depth: 3, max_args: 3}"
    )
    text = demo.run_demo(
        tmp_path,
        seeds=[0, 1],
        jobs=1,
        which="listops",
        overrides=[
            f"task.generate={tiny}",
            "train.epochs=1",
            "pretrain.epochs=1",
            "train.batch_size=4",
            "task.options.seq_len=32",
            "model.d_model=8",
            "model.d_state=4",
        ],
    )
    label = resolve(demo.DEMOS["listops"].presets[0]).label
    for row in (label, f"{label} (scratch, matched compute)", f"{label} + masked SPT"):
        assert f"| {row} |" in text
    assert "Verdict (SPT minus scratch, paired by seed, 95% CI Student t):" in text
    assert "Ranking of the models" not in text  # one model: nothing to rank
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


def test_an_unknown_demo_is_an_error_naming_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match="unknown demo 'cifar'; known: recall, listops"):
        demo.run_demo(tmp_path, which="cifar")
    with pytest.raises(SystemExit):
        main(["demo", "cifar"])


def test_the_demo_command_runs_the_named_demo_into_its_own_directory(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(demo, "run_demo", lambda out, jobs, which: calls.append((out, jobs, which)) or "text")
    assert main(["demo"]) == 0 and main(["demo", "listops", "--jobs", "1"]) == 0
    assert calls == [(None, None, "recall"), (None, 1, "listops")]
    assert [demo.DEMOS[w].out for _, _, w in calls] == ["runs/demo", "runs/demo-listops"]


@pytest.mark.slow
def test_demo_runs_the_comparison_and_writes_the_report(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for name in demo.DEMO_PRESETS:
        label = resolve(name).label
        assert f"| {label} |" in out and f"| {label} + causal SPT" in out
    assert "Verdict (SPT minus scratch" in out and "Ranking of the models by mean" in out
    assert (tmp_path / "report.md").is_file()


NEW_MIXERS = [
    "demo/recall/mamba2",
    "demo/recall/mamba3",
    "demo/recall/mamba3-mimo",
    "demo/recall/gla",
    "demo/recall/deltanet",
    "demo/recall/gated-deltanet",
    "demo/recall/linear-attention",
    "demo/recall/based",
]


def test_the_matrix_state_mixers_train_end_to_end_in_compare_from_their_presets(tmp_path, capsys):
    """Mamba-2, Mamba-3 (SISO and MIMO), GLA, DeltaNet, Gated DeltaNet, linear attention and Based from their recall presets (their widths): scratch
    and causal SPT with finetuning on a tiny associative recall, in one comparison and one report; every
    run records its state size."""
    import json

    from longrange.cli import main
    from longrange.experiment.config import resolve

    tiny = [o for o in TINY_RECALL if not o.startswith("model.d_model")] + ["compare.seeds=[0]"]
    args = ["compare", *[a for p in NEW_MIXERS for a in ("--preset", p)], "--out", str(tmp_path), *tiny]
    assert main(args) == 0, capsys.readouterr().err
    report = (tmp_path / "report.md").read_text()
    for preset in NEW_MIXERS:
        label = resolve(preset).label
        assert f"| {label} |" in report and f"| {label} + causal SPT" in report
    summaries = [json.loads(p.read_text()) for p in tmp_path.rglob("summary.json")]
    assert len(summaries) == len(NEW_MIXERS) * 3  # pretrain, finetune and scratch per model
    assert all(s["params"]["state"] > 0 for s in summaries)
