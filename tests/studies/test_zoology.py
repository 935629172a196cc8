"""Zoology's axis (``longrange zoology``, ``longrange.studies.zoology``): MQAR accuracy against state
size over widths, scratch and causal SPT; its experiments, aggregation, errors and a tiny run."""

from __future__ import annotations

import pytest
import torch

from longrange.errors import ConfigError
from longrange.studies import zoology as Z

TINY = (
    "train.max_steps=2",
    "pretrain.max_steps=2",
    "train.batch_size=8",
    "train.eval_every=2",
    "pretrain.eval_every=2",
)
TINY_TASK = {"n_train": 32, "n_val": 16, "n_test": 16}


def test_one_experiment_per_model_and_width_on_the_small_vocabulary_mqar():
    exps = Z.experiments(["transformer", "mamba-s6"], [8, 16], seeds=[0, 1])
    assert [(e.label, e.model.d_model) for e in exps] == [
        ("transformer w8", 8),
        ("transformer w16", 16),
        ("mamba-s6 w8", 8),
        ("mamba-s6 w16", 16),
    ]
    for e in exps:
        assert e.task.name == "mqar" and e.task.options["vocab_size"] == 64 and e.task.options["n_pairs"] == 8
        assert e.compare.objectives == ["causal"] and not e.compare.compute_matched and e.compare.seeds == [0, 1]
    assert exps[2].model.block == "mamba" and exps[2].model.primitive == "s6"
    (one,) = Z.experiments(
        ["lru"], [32], seeds=[0], task_options={"n_pairs": 4}, overrides=["train.lr=0.01"], field="d_state"
    )
    assert one.task.options["n_pairs"] == 4 and one.train["lr"] == 0.01
    assert (one.label, one.model.d_state, one.model.d_model) == ("lru d_state32", 32, 64)  # the LRU's state size


def test_long_filters_are_built_for_the_mqar_s_length_not_the_preset_s():
    from longrange.models.model import build_model

    hyena, base_conv = Z.experiments(["hyena", "base-conv"], [16], seeds=[0])
    assert hyena.model.primitive_options["l_max"] == 40  # the recall preset's is 24
    assert [e["options"].get("l_max") for e in base_conv.model.layers] == [None, 40]
    model = build_model(base_conv.model, input_kind="tokens", vocab_size=64, head="classify", n_out=64)
    assert model(torch.randint(0, 64, (2, 40))).shape == (2, 64)  # the preset's l_max of 24 would refuse 40
    (longer,) = Z.experiments(["hyena"], [16], seeds=[0], overrides=["task.options.seq_len=48"])
    assert longer.model.primitive_options["l_max"] == 48
    (given,) = Z.experiments(["hyena"], [16], seeds=[0], overrides=["model.primitive_options.l_max=64"])
    assert given.model.primitive_options["l_max"] == 64  # a length the user sets is kept


@pytest.mark.parametrize(
    "models, widths, match",
    [
        (["mamba-s7"], [8], r"unknown model 'mamba-s7' \(did you mean mamba-s6 or"),
        ([], [8], "name at least one model"),
        (["lru"], [0], "--widths: give one or more positive integers"),
        (["lru", "lru"], [8], "--models: 'lru' is given twice"),
        (["lru"], [8, 8], "--widths: 8 is given twice"),
    ],
)
def test_bad_settings_are_errors(models, widths, match):
    with pytest.raises(ConfigError, match=match):
        Z.experiments(models, widths, seeds=[0])


def test_points_average_over_seeds_and_skip_diverged_runs():
    def summary(label, regime, acc):
        return {
            "label": label,
            "regime": regime,
            "metric": "accuracy",
            "test": {"accuracy": acc},
            "params": {"total": 100, "state": 32},
        }

    summaries = [
        summary("lru w8", "scratch", 0.2),
        summary("lru w8", "scratch", 0.4),
        summary("lru w8", "causal-spt-all", 0.9),
        summary("lru w8", "causal-spt-all", float("nan")),
        summary("other w8", "scratch", 1.0),
    ]
    pts = {p.regime: p for p in Z.points(summaries, ["lru"], [8])}
    assert pts["scratch"].mean() == pytest.approx(0.3) and pts["scratch"].state == 32
    assert pts["causal-spt"].accuracies == (0.9,)  # the diverged run adds nothing
    text = Z.markdown(list(pts.values()), ["lru"], [8, 16])
    assert "| lru | 8 | 100 | 32 | 30.0 ± " in text and "| lru | 16 | | | missing | missing |" in text


def test_the_report_pairs_the_regimes_by_seed():
    """SPT minus scratch per (model, width), paired by seed (a seed with one regime only is left
    out of the pairs), with its interval, the bootstrap's, the exact sign-flip p and the seeds agreeing
    in sign."""

    def summary(regime, seed, acc):
        return {
            "label": "lru w8",
            "regime": regime,
            "seed": seed,
            "metric": "accuracy",
            "test": {"accuracy": acc},
            "params": {"total": 100, "state": 32},
        }

    scratch = [0.10, 0.20, 0.30, 0.40, 0.50, 0.60]
    spt = [0.90, 0.80, 0.95, 0.35, 1.00]  # seed 5 has no SPT run
    summaries = [summary("scratch", s, a) for s, a in enumerate(scratch)]
    summaries += [summary("causal-spt-all", s, a) for s, a in enumerate(spt)]
    pts = Z.points(summaries, ["lru"], [8, 16])
    lines = Z.paired_lines(pts, ["lru"], [8, 16])
    diffs = [100 * (b - a) for a, b in zip(scratch, spt)]
    from longrange.report.verdict import bootstrap_interval, paired_stat, sign_flip_p

    stat = paired_stat(diffs)
    low, high = bootstrap_interval(diffs)
    assert (
        f"| lru | 8 | {stat.mean:+.1f} [{stat.low:+.1f}, {stat.high:+.1f}] | [{low:+.1f}, {high:+.1f}] | "
        f"{sign_flip_p(diffs):.3f} | 4 of 5 |" in lines
    )
    assert min(diffs) <= low < high <= max(diffs) < stat.high  # the t interval passes the values' range
    assert "| lru | 16 | missing | | | |" in lines
    assert "## Causal SPT minus scratch (points of test accuracy, paired by seed)" in Z.markdown(pts, ["lru"], [8])


def test_a_tiny_axis_runs_and_reports(tmp_path, capsys):
    from longrange.cli import main

    args = [
        "zoology",
        "--out",
        str(tmp_path),
        "--models",
        "simple-s6",
        "--widths",
        "4,8",
        *TINY,
        *[f"--task-option={k}={v}" for k, v in TINY_TASK.items()],
    ]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "# MQAR accuracy against state size" in text
    assert "| simple-s6 | 4 | " in text.split("paired by seed")[1]  # the paired table, from the runs' seeds
    rows = (tmp_path / "zoology_points.csv").read_text().splitlines()
    assert len(rows) == 5  # 2 widths x 2 regimes
    states = {int(r.split(",")[1]): int(r.split(",")[4]) for r in rows[1:]}
    assert states[8] == 2 * states[4] > 0  # S6's state grows with its width
    assert (tmp_path / "zoology_state.png").stat().st_size > 0
    # the stage time of the model's runs: 2 widths x (scratch, pretraining, finetuning)
    import json

    summaries = [json.loads(p.read_text()) for p in tmp_path.glob("**/summary.json")]
    assert len(summaries) == 6
    hours = sum(s["seconds"] for s in summaries) / 3600
    cpu = sum(s["cpu_seconds"] for s in summaries) / 3600
    assert f"| simple-s6 | 6 of 6 | {hours:.2f} | {cpu:.2f} |" in text.split("## Time")[1]
    # --report: the same report again from the runs alone, nothing trained
    (tmp_path / "zoology_report.md").unlink()
    assert main([*args, "--report"]) == 0
    assert capsys.readouterr().out.strip() == text.strip()
    assert (tmp_path / "zoology_report.md").read_text().strip() == text.strip()
    assert len(list(tmp_path.glob("**/summary.json"))) == 6
    # ... of this study only: other settings, or a folder without its runs, are errors
    assert main([*args, "--report", "train.lr=0.5"]) == 1
    assert "were made with other settings" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main([*args[:2], str(empty), *args[3:], "--report"]) == 1
    assert "no finished run of this study" in capsys.readouterr().err
    assert main([*args, "--report", "--dry-run"]) == 1
    assert "choose one" in capsys.readouterr().err
