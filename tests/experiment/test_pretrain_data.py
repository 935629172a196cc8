"""``compare.pretrain_data: all``: self-pretraining reads the inputs of the whole training split, one
pretraining run per seed and objective shared by every labelled subset of a sweep."""

from __future__ import annotations

import json

import pytest
from tiny_experiment import tiny

from longrange.errors import ConfigError
from longrange.experiment.compare import compare
from longrange.experiment.config import experiment_from_dict
from longrange.experiment.plan import plan_grid


def _exp(data_dir, **compare_section):
    spec = tiny(data_dir)
    spec["compare"] = {"objectives": ["masked"], "seeds": [0], "train_subsets": [16, 32], **compare_section}
    return experiment_from_dict(spec)


def test_the_plan_shares_one_pretraining_on_all_inputs_across_subsets(tiny_listops_dir):
    plan = plan_grid([_exp(tiny_listops_dir, pretrain_data="all")])
    pre = [s for s in plan.stages if s.stage == "pretrain"]
    assert [s.id for s in pre] == ["listops/tiny/masked-spt-all/seed0/pretrain"] and pre[0].whole_train
    fine = [s for s in plan.stages if s.stage == "finetune"]
    assert [s.id for s in fine] == [
        "listops/tiny/subset16/masked-spt-all/seed0/finetune",
        "listops/tiny/subset32/masked-spt-all/seed0/finetune",
    ]
    assert all(s.after == [pre[0].id] and s.init_from == pre[0].id and s.regime == "masked-spt-all" for s in fine)
    matched = [s for s in plan.stages if s.regime == "scratch-matched"]
    assert [m.matched_to for m in matched] == [[[pre[0].id, f.id]] for f in fine]
    # the default: the SPT paper's setting, pretraining on the labelled subset, once per subset
    default = plan_grid([_exp(tiny_listops_dir)])
    assert [s.id for s in default.stages if s.stage == "pretrain"] == [
        "listops/tiny/subset16/masked-spt/seed0/pretrain",
        "listops/tiny/subset32/masked-spt/seed0/pretrain",
    ]
    with pytest.raises(ConfigError, match="compare.pretrain_data must be one of subset, all, got 'some'"):
        _exp(tiny_listops_dir, pretrain_data="some")


def test_pretraining_on_all_inputs_reads_the_whole_split_and_the_verdict_names_it(tiny_listops_dir, tmp_path, capsys):
    from longrange.report.collect import collect_runs
    from longrange.report.verdict import comparisons

    compare([_exp(tiny_listops_dir, pretrain_data="all")], tmp_path)
    summary = lambda sid: json.loads((tmp_path / sid / "summary.json").read_text())  # noqa: E731
    pre = summary("listops/tiny/masked-spt-all/seed0/pretrain")
    assert pre["train_size"] == 64 and pre["train_subset"] is None
    for n in (16, 32):
        fine = summary(f"listops/tiny/subset{n}/masked-spt-all/seed0/finetune")
        assert fine["train_size"] == n and fine["regime"] == "masked-spt-all"
        assert fine["pretrain"]["run"] == "../../../../masked-spt-all/seed0/pretrain"
        matched = summary(f"listops/tiny/subset{n}/scratch-matched/seed0")
        assert matched["steps"] == pre["steps"] + fine["steps"]
    found = comparisons(collect_runs([tmp_path]))
    assert {(c.regime, c.baseline, c.subset) for c in found} >= {
        ("masked-spt-all", "scratch", 16),
        ("masked-spt-all", "scratch-matched", 32),
    }
    from longrange.report.writer import report_and_verdict

    text = report_and_verdict(tmp_path)
    assert "tiny + masked SPT (all inputs) vs tiny on listops, train subset 16" in text
