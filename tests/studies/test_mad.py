"""The MAD protocol (``longrange mad``, ``longrange.studies.mad``): its plan, the best-of-grid
selection on validation, MAD scores, the sign-flip test, errors, and a tiny study run end to end."""

from __future__ import annotations

import json

import pytest

from longrange.errors import ConfigError
from longrange.studies import mad as M
from longrange.studies import mad_report as R
from longrange.studies.tables import group_times

TINY = (
    "model.d_model=16",
    "train.max_steps=2",
    "pretrain.max_steps=2",
    "train.batch_size=8",
    "pretrain.batch_size=8",
    "task.options.n_train=32",
    "task.options.n_val=16",
    "task.options.n_test=16",
    "train.eval_every=2",
    "pretrain.eval_every=2",
)


def settings(**kw) -> M.MadSettings:
    base = dict(
        models=("hyena", "gated-deltanet"),
        tasks=("mad-in-context-recall", "mad-memorization"),
        levels=("baseline", "seq_len=256", "vocab_size=512"),
        lrs=(5e-4, 1e-3),
        wds=(0.0, 0.1),
        seeds=(0, 1),
    )
    base.update(kw)
    return M.MadSettings(**base)


def test_the_plan_has_one_pretraining_per_cell_and_seed_and_the_grid_in_both_regimes():
    st = settings()
    plan, points = M.mad_plan(st)
    # levels: recall has baseline and seq_len=256; memorization baseline and vocab_size=512
    cells = 2 * 2 * 2  # tasks x their 2 levels x models
    assert sum(s.stage == "pretrain" for s in plan.stages) == cells * 2  # x seeds
    assert sum(s.regime == "scratch" for s in plan.stages) == cells * 2 * 4  # x seeds x grid
    finetunes = [s for s in plan.stages if s.stage == "finetune"]
    assert len(finetunes) == cells * 2 * 4 and len(points) == 2 * len(finetunes)
    for f in finetunes:
        assert f.init_from == f.after[0] and plan.by_id[f.init_from].stage == "pretrain"
        assert f.init_from.rsplit("/", 3)[0] == f.id.rsplit("/", 4)[0]  # the same task, model and level
    one = "mad-in-context-recall/hyena/seq_len-256/lr0.001-wd0.1/causal-spt/seed1/finetune"
    assert points[one] == M.Point("hyena", "mad-in-context-recall", "seq_len=256", "causal-spt", 1, 1e-3, 0.1)
    exp = plan.experiments[plan.by_id[one].experiment]
    assert (exp.train["lr"], exp.train["weight_decay"], exp.train["ssm_weight_decay"]) == (1e-3, 0.1, 0.1)
    assert exp.train["min_lr_ratio"] == pytest.approx(1e-6 / 1e-3)
    assert (exp.pretrain["lr"], exp.pretrain["weight_decay"]) == (5e-4, 0.0)
    assert exp.task.options == {"seq_len": 256}
    assert {e["options"]["l_max"] for e in exp.model.layers if isinstance(e, dict)} == {256}  # Hyena's filters follow
    memo = plan.experiments[
        plan.by_id["mad-memorization/gated-deltanet/vocab_size-512/lr0.0005-wd0/scratch/seed0"].experiment
    ]
    assert memo.task.options == {"vocab_size": 512}
    assert [e if isinstance(e, str) else e["primitive"] for e in memo.model.layers] == [
        "gated-deltanet",
        "swiglu",
        "gated-deltanet",
        "swiglu",
    ]


def test_answers_as_training_targets_reach_the_recall_tasks_only():
    st = settings(train_targets="answers", levels=("baseline",))
    plan, _ = M.mad_plan(st)
    options = {e.task.name: e.task.options for e in plan.experiments}
    assert options == {"mad-in-context-recall": {"train_targets": "answers"}, "mad-memorization": {}}


def test_every_level_by_default_and_scratch_only():
    st = M.MadSettings(models=("mamba",), tasks=("mad-memorization",), regimes=("scratch",), lrs=(1e-3,), wds=(0.0,))
    plan, points = M.mad_plan(st)
    assert [s.stage for s in plan.stages] == ["train"] * 6  # memorization: baseline + 5 vocabulary sizes
    assert len(points) == 6


def _summary(val: float | None, test: float | None) -> dict:
    return {
        "metric": "accuracy",
        "best_val": None if val is None else {"accuracy": val},
        "test": None if test is None else {"accuracy": test},
    }


def test_selection_takes_the_best_validation_point_and_reports_its_test():
    points = {f"{lr}-{wd}": M.Point("m", "t", "baseline", "scratch", 0, lr, wd) for lr in (1, 2) for wd in (0, 1)}
    summaries = {
        "1-0": _summary(0.5, 0.9),
        "1-1": _summary(0.7, 0.1),
        "2-0": _summary(0.7, 0.3),
        "2-1": _summary(0.6, 0.99),
    }
    (chosen,) = M.select(points, summaries)
    assert (chosen.lr, chosen.wd, chosen.val, chosen.reported) == (1, 1, 0.7, 0.1)  # the first of the tied 0.7s
    del summaries["2-1"]
    (missing,) = M.select(points, summaries)
    assert missing.lr is None and missing.reported is None and missing.missing == ("lr2-wd1",)
    summaries["2-1"] = _summary(float("nan"), 0.5)  # a diverged run is missing, never a number
    assert M.select(points, summaries)[0].missing == ("lr2-wd1",)
    lower = {
        k: {**_summary(v, 1 - v), "higher_is_better": False}
        for k, v in {"1-0": 0.5, "1-1": 0.7, "2-0": 0.2, "2-1": 0.6}.items()
    }  # a loss: the lowest is best
    assert M.select(points, lower)[0].lr == 2 and M.select(points, lower)[0].wd == 0


def test_scores_are_means_over_levels_then_tasks_and_missing_propagates():
    sel = [
        M.Selected("m", "a", level, "scratch", 0, 1e-3, 0.0, 0.0, test)
        for level, test in (("baseline", 0.2), ("x=1", 0.4))
    ]
    sel += [M.Selected("m", "b", "baseline", "scratch", 0, 1e-3, 0.0, 0.0, 0.9)]
    scores = R.task_scores(sel, {"a": ["baseline", "x=1"], "b": ["baseline"]})
    by = {s.task: s.score for s in scores}
    assert by["a"] == pytest.approx(0.3) and by["b"] == 0.9
    assert R.overall_scores(scores, ["a", "b"])[("m", "scratch", 0)] == pytest.approx(0.6)
    sel[1] = M.Selected("m", "a", "x=1", "scratch", 0, None, None, None, None, ("lr0.001-wd0",))
    scores = R.task_scores(sel, {"a": ["baseline", "x=1"], "b": ["baseline"]})
    assert {s.task: s.score for s in scores}["a"] is None
    assert R.overall_scores(scores, ["a", "b"])[("m", "scratch", 0)] is None


def test_sign_flip_p_is_exact():
    from longrange.report.verdict import sign_flip_p

    assert sign_flip_p([1.0, 2.0, 3.0]) == pytest.approx(2 / 8)  # only all-positive and all-negative reach 6
    assert sign_flip_p([1.0, -1.0]) == 1.0
    assert sign_flip_p([5.0, 5.0, 5.0, 5.0, 5.0]) == pytest.approx(2 / 32)  # five seeds: 0.0625 at best
    assert sign_flip_p([]) is None


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"models": ("hyenna",)}, r"unknown model 'hyenna' \(did you mean hyena or mh-hyena\?\)"),
        ({"models": ()}, "name at least one model"),
        ({"models": ("hyena", "hyena")}, "--models: 'hyena' is given twice"),
        ({"tasks": ("mad-copying",)}, "not one of MAD's tasks here"),
        ({"levels": ("n_train=7",)}, r"--levels: 'n_train=7' is no level of"),
        ({"lrs": ()}, "--lrs: give one or more finite numbers"),
        ({"wds": (-0.1,)}, "weight decays must be >= 0"),
        ({"regimes": ("masked-spt",)}, "--regimes: 'masked-spt' is not one of scratch, causal-spt"),
        ({"train_targets": "all"}, "--train-targets must be one of next-token, answers"),
    ],
)
def test_bad_settings_are_errors_naming_the_option(kw, match):
    with pytest.raises(ConfigError, match=match):
        settings(**kw)


def test_a_setting_that_would_change_what_a_level_varies_is_an_error():
    st = settings(levels=("seq_len=256",), tasks=("mad-in-context-recall",), overrides=("task.options.seq_len=64",))
    with pytest.raises(ConfigError, match=r"changes seq_len, which the level 'seq_len=256' of mad-in-context-recall"):
        M.mad_plan(st)


def test_a_tiny_study_runs_resumes_and_reports(tmp_path, capsys):
    from longrange.cli import main

    out = tmp_path / "mad"
    args = [
        "mad",
        "--out",
        str(out),
        "--models",
        "gated-deltanet",
        "--tasks",
        "mad-memorization,mad-compression",  # compression: self-pretrained, then finetuned with its decode-last head
        "--levels",
        "baseline",
        "--lrs",
        "1e-3,5e-4",
        "--wds",
        "0",
        *TINY,
    ]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "## scratch: MAD score" in text and "## causal-spt minus scratch" in text
    rows = (out / "mad_selected.csv").read_text().splitlines()
    assert rows[0].startswith(
        "model,task,level,regime,seed,lr,weight_decay,val_accuracy,reported_split,reported_accuracy"
    )
    assert len(rows) == 5  # scratch and causal-spt for seed 0, each task
    for row in rows[1:]:
        fields = row.split(",")
        assert fields[5] in ("0.001", "0.0005") and fields[8] == "test" and 0 <= float(fields[9]) <= 1
    assert (out / "mad_scores.png").stat().st_size > 0
    assert (out / "mad_spt_minus_scratch.png").stat().st_size > 0  # both regimes: their paired differences
    assert json.loads((out / "mad.json").read_text())["models"] == ["gated-deltanet"]
    # Each task's stage time: its stages (2 grid points x 2 regimes + 1 pretraining), the summaries'
    # seconds and CPU seconds summed.
    report = (out / "mad_report.md").read_text()
    summaries = [json.loads(p.read_text()) for p in out.glob("mad-memorization/**/summary.json")]
    assert len(summaries) == 5
    wall = sum(s["seconds"] for s in summaries) / 3600
    cpu = sum(s["cpu_seconds"] for s in summaries) / 3600
    assert f"| mad-memorization | 5 of 5 | {wall:.2f} | {cpu:.2f} |" in report
    assert "| all | 10 of 10 |" in report and "Unfinished" not in report
    # Each task's state per sequence from its own runs (Gated DeltaNet's does not grow with the length).
    built = R.build_report(M.load_settings(out), out)
    state = summaries[0]["params"]["state"]
    assert built.states == {"gated-deltanet": {"mad-memorization": state, "mad-compression": state}}
    assert f"| gated-deltanet | {summaries[0]['params']['total']:,} | {state:,} |" in report
    # Run again: everything is reused; --report rebuilds the report from the runs alone.
    assert main(args) == 0
    assert "## scratch: MAD score" in capsys.readouterr().out
    assert main(["mad", "--out", str(out), "--report"]) == 0
    assert "gated-deltanet" in capsys.readouterr().out
    # Another study into the same directory is an error, not a mixed report.
    assert main([*args[: -len(TINY)], "--seeds", "1", *TINY]) == 1
    assert "holds a MAD study with other settings (seeds differ)" in capsys.readouterr().err
    # --report of runs made with other settings than the study's now resolve to (a preset or default
    # changed since) is an error naming them, not a report.
    saved = json.loads((out / "mad.json").read_text())
    (out / "mad.json").write_text(json.dumps({**saved, "overrides": [*saved["overrides"], "model.dropout=0.1"]}))
    assert main(["mad", "--out", str(out), "--report"]) == 1
    err = capsys.readouterr().err
    assert "were made with other settings" in err and "model.dropout: 0.0 -> 0.1" in err


def test_the_cpu_protocol_is_its_rule():
    import argparse

    from longrange.studies.cli import settings_from_args

    args = argparse.Namespace(
        cpu=True,
        screen=False,
        models=None,
        tasks=None,
        levels=None,
        lrs=None,
        wds=None,
        seeds="0,1",
        regimes=None,
        pretrain_lr=None,
        pretrain_wd=None,
        train_targets=None,
        settings=["train.max_steps=10"],
        grid_from=None,
    )
    st = settings_from_args(args)
    assert st.models == M.CPU_MODELS and len(st.models) == 8 and st.seeds == (0, 1)
    assert st.tasks == M.MAD_TASKS[:5] and "mad-compression" in M.MAD_TASKS  # fixed before compression was added
    assert (st.levels, st.lrs, st.wds) == (("baseline", "n_train=800"), (5e-4, 1e-3), (0.0,))
    assert st.overrides[-1] == "train.max_steps=10" and "train.max_steps=500" in st.overrides  # the user's last
    plan, _ = M.mad_plan(M.MadSettings(**{**st.to_dict(), "seeds": (0,), "overrides": M.CPU_PROTOCOL["overrides"]}))
    assert len(plan.stages) == 360  # 8 models x 9 cells x (1 pretraining + 2 x 2 runs): the budget's count
    exp = plan.experiments[0]
    assert (exp.model.d_model, exp.train["max_steps"], exp.train["batch_size"]) == (64, 500, 32)


def test_a_screen_reads_no_test_split_and_scores_validation(tmp_path):
    st = M.MadSettings(
        models=("gated-deltanet",),
        tasks=("mad-memorization",),
        levels=("baseline",),
        lrs=(1e-3,),
        wds=(0.0,),
        regimes=("scratch",),
        screen=True,
        overrides=TINY,
    )
    plan, _ = M.mad_plan(st)
    assert plan.experiments[0].train["test_split"] is False
    report = R.run_mad(st, tmp_path)
    (summary,) = plan.summaries(tmp_path, [s.id for s in plan.stages]).values()
    assert summary["test"] is None and summary["best_val"]["accuracy"] is not None  # the test split was not read
    (chosen,) = report.selected
    assert chosen.reported == chosen.val == summary["best_val"]["accuracy"]
    assert "screen: validation accuracy, the test split unread" in report.markdown()
    assert "validation," in report.csv().splitlines()[1]


def test_test_split_false_is_a_setting_of_the_run_s_identity():
    from longrange.identity import differences
    from longrange.train.config import TrainConfig

    assert TrainConfig().test_split is True
    with pytest.raises(ConfigError, match="test_split"):
        TrainConfig(test_split="no")
    base = {"train": {"lr": 0.5}}
    assert differences(base, {"train": {"lr": 0.5, "test_split": True}}) == []  # the default: no identity change
    assert differences(base, {"train": {"lr": 0.5, "test_split": False}}) == ["train.test_split: True -> False"]


def test_a_bad_list_option_is_an_error_naming_it(tmp_path, capsys):
    from longrange.cli import main

    assert main(["mad", "--out", str(tmp_path), "--models", "mamba", "--lrs", "1e-3,fast"]) == 1
    assert "--lrs: expected comma-separated numbers, got '1e-3,fast'" in capsys.readouterr().err


def test_the_published_scores_sit_beside_a_model_mad_reports(tmp_path):
    st = settings(models=("hyena", "gated-deltanet"), seeds=(0,), regimes=("scratch",), levels=("baseline",))
    sel = [M.Selected(m, t, "baseline", "scratch", 0, 1e-3, 0.0, 0.5, 0.25) for m in st.models for t in st.tasks]
    scores = R.task_scores(sel, {t: ["baseline"] for t in st.tasks})
    report = R.MadReport(st, sel, scores, R.overall_scores(scores, list(st.tasks)))
    text = report.markdown()
    # Hyena's published in-context recall 81.8 and memorization 89.5; overall over this study's two tasks
    assert "| hyena (published) | 81.8 | 89.5 | 85.7 |" in text
    assert "gated-deltanet (published)" not in text and "Figure 1" in text
    # this study's mean minus the published score, per task and overall (25% on both tasks here)
    icr, mem = (M.PUBLISHED_SCORES["hyena"][t] for t in st.tasks)
    gaps = [25 - 100 * icr, 25 - 100 * mem, 25 - 100 * (icr + mem) / 2]
    assert "| hyena, scratch minus published | " + " | ".join(f"{g:+.1f}" for g in gaps) + " |" in text
    assert R.scores_plot(report, tmp_path / "scores.png").exists()
    assert R.differences_plot(report, tmp_path / "differences.png") is None  # scratch alone: nothing paired
    unscored = R.MadReport(settings(models=("hyena",)), [], [], {}).markdown()
    assert "| hyena, causal-spt minus published | missing | missing | missing |" in unscored
    no_hyena = R.MadReport(settings(models=("gated-deltanet",)), [], [], {})
    assert "Published MAD scores" not in no_hyena.markdown()


def test_stage_time_counts_the_plan_s_stages_and_says_where_cpu_time_is_missing():
    t = group_times(
        [
            ("mad-memorization", {"seconds": 3600.0, "cpu_seconds": 1800.0}),
            ("mad-memorization", {"seconds": 1800.0}),  # a stage run before CPU time was recorded
            ("mad-memorization", None),  # not finished
            ("mad-memorization", None),
        ]
    )["mad-memorization"]
    assert (t.planned, t.finished, t.seconds, t.cpu_seconds, t.with_cpu) == (4, 2, 5400.0, 1800.0, 1)
    report = R.MadReport(M.MadSettings(models=("hyena",)), [], [], {}, times={"mad-memorization": t})
    text = report.markdown()
    assert "| mad-memorization | 2 of 4 | 1.50 | 0.50 (1 of 2 stages recorded it) |" in text
    assert "**Unfinished: 2 of 4 stages have finished**" in text  # said at the top of a partial report


def test_the_published_scores_are_the_figures_own_mean():
    """Read off MAD's Figure 1 (benchmarks/mad_published_scores.py): its left panel places Hyena +
    SwiGLU at a mean of 0.6606 over the six tasks, which the six readings reproduce."""
    hyena = M.PUBLISHED_SCORES["hyena"]
    assert set(hyena) == set(M.MAD_TASKS)
    assert sum(hyena.values()) / 6 == pytest.approx(0.6606, abs=5e-4)


def test_the_published_scores_agree_with_the_copy_a_second_paper_prints():
    """Yang et al. 2024 (DeltaNet, arXiv 2406.06484, Figure 3) prints MAD's Hyena and Multihead
    Hyena rows as numbers (to 0.1 points, "borrowed from Poli et al."): the Figure 1 readings agree."""
    printed = {  # in-context, fuzzy, noisy, selective copying, compression, memorization
        "hyena": (81.7, 7.9, 78.8, 93.1, 45.2, 89.5),
        "mh-hyena": (99.0, 14.4, 98.6, 93.0, 44.8, 89.4),
    }
    order = ("in-context-recall", "fuzzy-recall", "noisy-recall", "selective-copying", "compression", "memorization")
    for model, row in printed.items():
        for task, value in zip(order, row):
            assert 100 * M.PUBLISHED_SCORES[model][f"mad-{task}"] == pytest.approx(value, abs=0.15), (model, task)


# ----------------------------------------------------------------------------------------------
# A confirmation at the grid points a screen chose (--grid-from)


def test_the_screen_chooses_by_mean_validation_over_seeds_and_reads_no_test():
    points = {
        f"{lr}-{seed}": M.Point("m", "t", "baseline", "scratch", seed, lr, 0.0) for lr in (1, 2) for seed in (0, 1)
    }
    vals = {"1-0": 0.9, "1-1": 0.1, "2-0": 0.8, "2-1": 0.8}  # lr 1 is best in seed 0 alone; lr 2 on the mean
    summaries = {k: {"metric": "accuracy", "best_val": {"accuracy": v}, "test": None} for k, v in vals.items()}
    chosen, incomplete = M.screen_choice(points, summaries)
    assert chosen == {("m", "t", "baseline", "scratch"): (2, 0.0)} and incomplete == {}
    summaries["2-0"]["best_val"]["accuracy"] = 0.2  # a tie of means (0.5): the first in grid order
    assert M.screen_choice(points, summaries)[0] == {("m", "t", "baseline", "scratch"): (1, 0.0)}
    summaries["1-1"]["best_val"]["accuracy"] = float("nan")  # a diverged run: the cell cannot choose
    del summaries["2-0"]  # an unfinished one
    chosen, incomplete = M.screen_choice(points, summaries)
    assert chosen == {} and incomplete == {("m", "t", "baseline", "scratch"): ("lr1-wd0 seed1", "lr2-wd0 seed0")}


def _fixed(st: M.MadSettings, lr: float = 1e-3) -> tuple:
    return tuple((*cell, lr if cell[3] == "scratch" else 5e-4, 0.0) for cell in st.cells())


def test_fixed_points_train_each_cell_once_per_seed():
    st = settings(levels=("baseline",), seeds=(3,))
    fixed = settings(levels=("baseline",), seeds=(3,), fixed=_fixed(st))
    plan, points = M.mad_plan(fixed)
    cells = 2 * 2  # models x tasks
    assert [sum(s.stage == kind for s in plan.stages) for kind in ("pretrain", "train", "finetune")] == [cells] * 3
    assert {(p.regime, p.lr) for p in points.values()} == {("scratch", 1e-3), ("causal-spt", 5e-4)}
    for stage in plan.stages:
        exp = plan.experiments[stage.experiment]
        if stage.stage != "pretrain":
            assert exp.train["lr"] == points[stage.id].lr
    # The grid's plan is unchanged by the option's existence: the same ids in the same order.
    whole, _ = M.mad_plan(st)
    assert [s.id for s in whole.stages][:5] == [
        "mad-in-context-recall/hyena/baseline/causal-spt/seed3/pretrain",
        "mad-in-context-recall/hyena/baseline/lr0.0005-wd0/scratch/seed3",
        "mad-in-context-recall/hyena/baseline/lr0.0005-wd0/causal-spt/seed3/finetune",
        "mad-in-context-recall/hyena/baseline/lr0.0005-wd0.1/scratch/seed3",
        "mad-in-context-recall/hyena/baseline/lr0.0005-wd0.1/causal-spt/seed3/finetune",
    ]
    assert M.MadSettings.from_dict(json.loads(json.dumps(fixed.to_dict()))) == fixed  # as mad.json keeps it


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda f: f[1:], r"no point for 1 of the study's cells, e.g. hyena mad-in-context-recall baseline scratch"),
        (lambda f: (*f, f[0]), r"the cell hyena mad-in-context-recall baseline scratch is given twice"),
        (lambda f: (*f, ("mamba", *f[0][1:])), r"1 points for cells outside the study, e.g. mamba"),
        (lambda f: ((*f[0][:4], 0.0, 0.0), *f[1:]), r"needs a positive learning rate"),
        (lambda f: ((*f[0][:5],), *f[1:]), r"each entry is \(model, task, level, regime, lr, weight decay\)"),
    ],
)
def test_bad_fixed_points_are_errors_naming_the_cell(change, match):
    st = settings(levels=("baseline",))
    with pytest.raises(ConfigError, match=match):
        settings(levels=("baseline",), fixed=change(_fixed(st)))


def _args(out, *extra: str) -> list[str]:
    return [
        "mad",
        "--out",
        str(out),
        "--models",
        "gated-deltanet",
        "--tasks",
        "mad-memorization",
        "--levels",
        "baseline",
        "--lrs",
        "1e-3,5e-4",
        "--wds",
        "0",
        *extra,
        *TINY,
    ]


def test_a_confirmation_runs_the_screen_s_choice_on_fresh_seeds_and_data(tmp_path, capsys, monkeypatch):
    import shutil

    from longrange.cli import main

    screen, confirm = tmp_path / "screen", tmp_path / "confirm"
    assert main(_args(screen, "--screen", "--seeds", "0,1")) == 0
    capsys.readouterr()
    st = M.load_settings(screen)
    plan, points = M.mad_plan(st)
    chosen, incomplete = M.screen_choice(points, plan.summaries(screen, list(points)))
    assert not incomplete and len(chosen) == 2  # scratch and causal-spt

    assert main(_args(confirm, "--grid-from", str(screen), "--seeds", "2", "task.seed=1")) == 0
    text = capsys.readouterr().out
    assert "each cell at the grid point a screen chose for it" in text
    # The finished screen's claims, copied before the confirmation trained and tested in its report
    # (one model: claims of SPT alone, if any met the rule).
    from longrange.studies.mad_claims import load_claims

    claims = load_claims(screen)
    assert claims is not None and claims.seeds == (0, 1) and load_claims(confirm) == claims
    assert {c.kind for c in claims.claims} <= {"spt"}
    assert "## The screen's claims (seeds 0, 1), tested" in text
    assert ("The screen made no claims." in text) == (not claims.claims)
    done = M.load_settings(confirm)
    assert {tuple(e[:4]): tuple(e[4:]) for e in done.fixed} == chosen and not done.screen
    stages = [p.relative_to(confirm).parent.as_posix() for p in confirm.rglob("summary.json")]
    assert len(stages) == 3  # one pretraining, one scratch run and one finetuning
    rows = (confirm / "mad_selected.csv").read_text().splitlines()[1:]
    for row in rows:
        fields = row.split(",")
        assert fields[8] == "test" and chosen[tuple(fields[:4])] == (float(fields[5]), float(fields[6]))
    assert main(_args(confirm, "--grid-from", str(screen), "--seeds", "2", "task.seed=1")) == 0  # resumes
    capsys.readouterr()

    errors = [
        (("--seeds", "1,2", "task.seed=1"), "seeds 1 were screened there; a confirmation runs fresh seeds"),
        (("--seeds", "2"), "draws the screen's data (task.seed=0); give it a fresh data seed, e.g. task.seed=1"),
        (("--seeds", "2", "task.seed=1", "train.max_steps=3"), "the screen ran other settings (overrides differ)"),
        (("--seeds", "2", "--pretrain-lr", "1e-3", "task.seed=1"), "(pretrain_lr differ)"),
    ]
    for extra, message in errors:
        assert main(_args(tmp_path / "x", "--grid-from", str(screen), *extra)) == 1
        assert message in capsys.readouterr().err
    outside = _args(tmp_path / "x", "--grid-from", str(screen), "--seeds", "2", "task.seed=1")
    outside[outside.index("mad-memorization")] = "mad-memorization,mad-in-context-recall"
    assert main(outside) == 1
    assert "the screen did not run 2 of the cells asked for, e.g. gated-deltanet mad-in-context-recall" in (
        capsys.readouterr().err
    )
    preset = M.model_preset  # the preset changed since the screen ran: the confirmation would train another model
    with monkeypatch.context() as m:
        m.setattr(M, "model_preset", lambda name: {**preset(name), "model": {**preset(name)["model"], "dropout": 0.1}})
        assert main(_args(tmp_path / "x", "--grid-from", str(screen), "--seeds", "2", "task.seed=1")) == 1
    err = capsys.readouterr().err
    assert "gated-deltanet mad-memorization baseline " in err and "would not run the screen's model" in err
    assert "model.dropout: 0.0 -> 0.1" in err
    recorded = json.loads((screen / "plan.json").read_text())  # so did a training default
    for exp in recorded["experiments"]:
        exp["train"]["warmup"] = 7
    (screen / "plan.json").write_text(json.dumps(recorded))
    assert main(_args(tmp_path / "x", "--grid-from", str(screen), "--seeds", "2", "task.seed=1")) == 1
    assert "train.warmup: 7 -> 0" in capsys.readouterr().err
    shutil.rmtree(screen / "mad-memorization/gated-deltanet/baseline/lr0.0005-wd0/scratch/seed1")
    assert main(_args(tmp_path / "x", "--grid-from", str(screen), "--seeds", "2", "task.seed=1")) == 1
    err = capsys.readouterr().err
    assert "the screen has not finished 1 of the cells asked for, e.g. gated-deltanet mad-memorization" in err
    assert "(lr0.0005-wd0 seed1)" in err
    assert not (tmp_path / "x").exists()  # nothing was written for a confirmation that could not start


def test_the_report_gives_each_level_its_difference_and_ranking():
    st = settings(
        tasks=("mad-in-context-recall", "mad-memorization"), levels=("baseline", "n_train=800"), seeds=(0, 1, 2)
    )
    assert list(st.task_levels("mad-memorization")) == ["baseline"]  # one level: in the baseline's ranking only
    known = {  # (model, task, level) -> (scratch, causal-spt), the same on every seed
        ("hyena", "mad-in-context-recall", "baseline"): (0.5, 0.5),
        ("hyena", "mad-in-context-recall", "n_train=800"): (0.2, 0.6),
        ("gated-deltanet", "mad-in-context-recall", "baseline"): (0.9, 0.9),
        ("gated-deltanet", "mad-in-context-recall", "n_train=800"): (0.4, 0.4),
        ("hyena", "mad-memorization", "baseline"): (0.5, 0.5),
        ("gated-deltanet", "mad-memorization", "baseline"): (0.5, 0.5),
    }
    sel = [
        M.Selected(m, t, level, regime, seed, 1e-3, 0.0, 0.5, pair[i])
        for (m, t, level), pair in known.items()
        for i, regime in enumerate(("scratch", "causal-spt"))
        for seed in st.seeds
    ]

    def report(selected):
        scores = R.task_scores(selected, {t: list(st.task_levels(t)) for t in st.tasks})
        return R.MadReport(st, selected, scores, R.overall_scores(scores, list(st.tasks))).markdown()

    text = report(sel)
    assert (
        "| hyena | mad-in-context-recall | n_train=800 | 20.0 ± 0.0 | 60.0 ± 0.0 | +40.0 [+40.0, +40.0] | [+40.0, +40.0] | 0.250 | 3 of 3 |"
        in text
    )
    assert "| gated-deltanet | mad-in-context-recall | baseline | 90.0 ± 0.0 | 90.0 ± 0.0 | +0.0" in text
    assert "mad-memorization | n_train=800" not in text  # a level the task does not have
    # at the fewest examples (in-context recall alone) SPT reverses the order; at the baseline it does not
    assert (
        "- n_train=800 (mad-in-context-recall), scratch: gated-deltanet (40.0; best in 3 of 3 seeds) > hyena (20.0; best in 0 of 3 seeds)"
        in text
    )
    assert (
        "- n_train=800 (mad-in-context-recall), causal-spt: hyena (60.0; best in 3 of 3 seeds) > gated-deltanet (40.0;"
        in text
    )
    assert (
        "- baseline (mad-in-context-recall, mad-memorization), causal-spt: gated-deltanet (70.0; best in 3 of 3 seeds) > hyena (50.0;"
        in text
    )
    # each task's ranking (its score, the mean over its levels)
    ranked = text.split("## Rankings by task")[1]
    assert "- mad-in-context-recall, scratch: gated-deltanet (65.0; best in 3 of 3 seeds) > hyena (35.0;" in ranked
    assert "- mad-in-context-recall, causal-spt: gated-deltanet (65.0; best in 3 of 3 seeds) > hyena (55.0;" in ranked
    assert "- mad-memorization, scratch: hyena (50.0; best in 3 of 3 seeds) > gated-deltanet (50.0; best in 3" in ranked
    # a missing run: its cell says how many seeds it has, and the model is named as not ranked, not dropped
    gap = [
        s
        for s in sel
        if not (s.model == "hyena" and s.level == "n_train=800" and s.regime == "scratch" and s.seed == 2)
    ]
    text = report(gap)
    assert (
        "| hyena | mad-in-context-recall | n_train=800 | 20.0 ± 0.0 (2 of 3 seeds) | 60.0 ± 0.0 | +40.0 [+40.0, +40.0] | [+40.0, +40.0] | 0.500 | 2 of 2 |"
        in text
    )
    assert (
        "- n_train=800 (mad-in-context-recall), scratch: gated-deltanet (40.0; best in 2 of 2 seeds); not ranked, a score missing: hyena"
        in text
    )
    # one level per task: no by-level section
    one = settings(levels=("baseline",), seeds=(0,))
    assert "By level" not in R.MadReport(one, [], [], {}).markdown()


def test_a_state_that_grows_with_the_length_is_given_per_task():
    st = settings(models=("mh-attention", "gated-deltanet"), seeds=(0,), regimes=("scratch",), levels=("baseline",))
    states = {
        "mh-attention": {"mad-in-context-recall": 32512, "mad-memorization": 8064},
        "gated-deltanet": {"mad-in-context-recall": 4096, "mad-memorization": 4096},
    }
    sizes = {"mh-attention": {"total": 103893, "state": 32512}, "gated-deltanet": {"total": 99000, "state": 4096}}
    text = R.MadReport(st, [], [], {}, sizes, states=states).markdown()
    assert "| mh-attention | 103,893 | 8,064-32,512 |" in text and "| gated-deltanet | 99,000 | 4,096 |" in text
    assert "mh-attention: in-context-recall 32,512, memorization 8,064." in text
    assert "gated-deltanet: in-context" not in text
