"""The claims a MAD screen makes by the rule of docs/recall-protocols.md and their test on a
confirmation (``longrange.studies.mad_claims``), on reports built from chosen scores."""

from __future__ import annotations

import json

import pytest

from longrange.errors import ConfigError
from longrange.studies import mad as M
from longrange.studies import mad_claims as C
from longrange.studies import mad_report as R

TASKS = ("mad-in-context-recall", "mad-memorization")


def report(scores: dict, seeds=(0, 1, 2), models=("a", "b"), screen=True, claims=None) -> R.MadReport:
    """A report whose task scores are ``scores[(model, regime)]``: one list per task, one value per
    seed (None: missing). The models' names are not checked by a report, only by the settings."""
    st = object.__new__(M.MadSettings)  # the settings' own checks want real model names
    for k, v in dict(
        models=models,
        tasks=TASKS,
        levels=(),
        lrs=M.MAD_LRS,
        wds=M.MAD_WDS,
        seeds=seeds,
        regimes=M.REGIMES,
        pretrain_lr=5e-4,
        pretrain_wd=0.0,
        train_targets="next-token",
        overrides=(),
        screen=screen,
        fixed=(),
    ).items():
        object.__setattr__(st, k, v)
    task_scores = [
        R.TaskScore(model, task, regime, seed, per_task[t][i], 1)
        for (model, regime), per_task in scores.items()
        for t, task in enumerate(TASKS)
        for i, seed in enumerate(seeds)
    ]
    overall = R.overall_scores(task_scores, TASKS)
    return R.MadReport(st, [], task_scores, overall, claims=claims)


def flat(value: float, n: int = 3) -> list[float]:
    return [value] * n


#: a: SPT raises in-context recall by about 30 points on every seed, memorization unchanged;
#: b: scratch better than a, SPT lowers b's memorization by 6-8 points on every seed.
SCREEN = {
    ("a", "scratch"): [[0.30, 0.32, 0.28], [0.50, 0.50, 0.50]],
    ("a", "causal-spt"): [[0.60, 0.63, 0.58], [0.50, 0.51, 0.49]],
    ("b", "scratch"): [[0.55, 0.56, 0.54], [0.70, 0.72, 0.71]],
    ("b", "causal-spt"): [[0.55, 0.57, 0.55], [0.63, 0.65, 0.64]],
}


def test_the_rule_makes_each_kind_of_claim_and_no_other():
    claims = C.screen_claims(report(SCREEN))
    texts = {c.text(): c for c in claims.claims}
    assert set(texts) == {
        "causal SPT raises a on mad-in-context-recall",
        "causal SPT raises a on its overall score",  # (+30.3 + 0) / 2 = +15.2
        "causal SPT lowers b on mad-memorization",
        "b is the best model overall in scratch",
        "b is the best model overall in causal-spt",
        "self-pretraining keeps the best model overall",
    }
    assert texts["causal SPT raises a on mad-in-context-recall"].screen == "+30.3 points, 3 of 3 seeds agreeing"
    # b's overall SPT difference: (+0.7 - 7.0) / 2 = -3.2, under 5 points: no claim; a's memorization: 0.
    assert claims.models == ("a", "b") and claims.tasks == TASKS and claims.seeds == (0, 1, 2)


def test_a_large_mean_without_every_seed_agreeing_or_a_tie_is_no_claim():
    screen = dict(SCREEN)
    screen[("a", "causal-spt")] = [[0.60, 0.63, 0.27], [0.50, 0.51, 0.49]]  # seed 2: SPT lower
    screen[("b", "scratch")] = [[0.55, 0.56, 0.54], [0.70, 0.72, 0.71]]
    screen[("a", "scratch")] = [[0.55, 0.32, 0.28], [0.70, 0.50, 0.50]]  # seed 0: a ties b from scratch
    texts = {c.text() for c in C.screen_claims(report(screen)).claims}
    assert "causal SPT raises a on mad-in-context-recall" not in texts
    assert "b is the best model overall in scratch" not in texts  # a tie on seed 0 is not best
    assert "b is the best model overall in causal-spt" in texts


def test_five_points_is_the_line():
    base = dict(SCREEN)
    base[("a", "causal-spt")] = [[0.351, 0.371, 0.331], [0.50, 0.50, 0.50]]  # +5.1 on recall, +2.55 overall
    texts = {c.text() for c in C.screen_claims(report(base)).claims}
    assert "causal SPT raises a on mad-in-context-recall" in texts
    assert "causal SPT raises a on its overall score" not in texts
    base[("a", "causal-spt")] = [[0.349, 0.369, 0.329], [0.50, 0.50, 0.50]]  # +4.9
    assert "causal SPT raises a on mad-in-context-recall" not in {
        c.text() for c in C.screen_claims(report(base)).claims
    }


def test_an_unfinished_screen_makes_no_claims_and_says_what_is_missing():
    screen = dict(SCREEN)
    screen[("b", "causal-spt")] = [[0.55, None, 0.55], [0.63, 0.65, 0.64]]
    r = report(screen)
    with pytest.raises(ConfigError, match=r"not finished: 1 scores are missing, e\.g\. b mad-in-context-recall "):
        C.screen_claims(r)
    assert r.screen_claims() is None
    assert "once every score is in (1 missing)" in r.markdown()
    assert "## Claims for a confirmation" in report(SCREEN).markdown()


def confirmation(scores: dict, claims: C.Claims, **kw) -> R.MadReport:
    return report(scores, seeds=(5, 6, 7, 8, 9), screen=False, claims=claims, **kw)


def five(values3: list[list[float]]) -> list[list[float]]:
    """Three seeds' values stretched to five (the first two repeated, shifted a little)."""
    return [v + [v[0] + 0.004, v[1] - 0.004] for v in values3]


def test_a_confirmation_that_repeats_the_screen_confirms_every_claim():
    claims = C.screen_claims(report(SCREEN))
    tested = C.check_claims(claims, confirmation({k: five(v) for k, v in SCREEN.items()}, claims))
    assert [t.verdict for t in tested] == ["confirmed"] * len(claims.claims)
    text = confirmation({k: five(v) for k, v in SCREEN.items()}, claims).markdown()
    assert "Of the 3 SPT claims confirmed, 3 also hold under Holm's adjustment over the 3 SPT claims tested" in text
    spt = next(t for t in tested if t.claim.text() == "causal SPT raises a on mad-in-context-recall")
    assert spt.measured.startswith("+30.") and "[+" in spt.measured


def test_a_confirmation_that_does_not_repeat_it_confirms_nothing_it_refutes():
    claims = C.screen_claims(report(SCREEN))
    noisy = {k: five(v) for k, v in SCREEN.items()}
    # a's SPT gain on recall is noise around zero; b is no longer best with SPT (a passes it)
    noisy[("a", "causal-spt")] = [[0.40, 0.25, 0.35, 0.28, 0.36], [0.90, 0.90, 0.90, 0.90, 0.90]]
    tested = {t.claim.text(): t for t in C.check_claims(claims, confirmation(noisy, claims))}
    assert tested["causal SPT raises a on mad-in-context-recall"].verdict == "not confirmed"
    assert tested["b is the best model overall in causal-spt"].verdict == "not confirmed"
    assert tested["b is the best model overall in causal-spt"].measured.startswith("best by mean: a ")
    assert tested["self-pretraining keeps the best model overall"].verdict == "not confirmed"
    assert tested["b is the best model overall in scratch"].verdict == "confirmed"
    text = confirmation(noisy, claims).markdown()
    assert "## The screen's claims (seeds 0, 1, 2), tested" in text
    assert "| causal SPT raises a on mad-in-context-recall | +30.3 points, 3 of 3 seeds agreeing |" in text
    assert "Of the 2 SPT claims confirmed, 2 also hold under Holm's adjustment over the 3 SPT claims tested" in text


def test_best_needs_every_paired_interval_above_zero_not_only_the_best_mean():
    claims = C.screen_claims(report(SCREEN))
    close = {k: five(v) for k, v in SCREEN.items()}
    # b's mean stays best from scratch but a is above it on two seeds of five
    close[("a", "scratch")] = [[0.80, 0.30, 0.80, 0.30, 0.30], [0.70, 0.50, 0.70, 0.50, 0.50]]
    tested = {t.claim.text(): t for t in C.check_claims(claims, confirmation(close, claims))}
    t = tested["b is the best model overall in scratch"]
    assert t.verdict == "not confirmed" and t.measured.startswith("best by mean: b ") and "bound -" in t.measured


def test_claims_outside_the_confirmation_or_with_missing_scores_are_not_tested():
    claims = C.screen_claims(report(SCREEN))
    only_a = {k: five(v) for k, v in SCREEN.items() if k[0] == "a"}
    tested = {t.claim.text(): t for t in C.check_claims(claims, confirmation(only_a, claims, models=("a",)))}
    assert tested["causal SPT raises a on mad-in-context-recall"].verdict == "confirmed"
    assert tested["causal SPT lowers b on mad-memorization"].measured == "b is not in the confirmation"
    assert tested["b is the best model overall in scratch"].verdict == "not tested"
    gap = {k: five(v) for k, v in SCREEN.items()}
    gap[("a", "causal-spt")][0][3] = None
    tested = {t.claim.text(): t for t in C.check_claims(claims, confirmation(gap, claims))}
    t = tested["causal SPT raises a on mad-in-context-recall"]
    assert (t.verdict, t.measured) == (
        "not tested",
        "1 scores are missing, e.g. a mad-in-context-recall causal-spt seed 8",
    )
    assert tested["causal SPT lowers b on mad-memorization"].verdict == "confirmed"


def test_claims_are_kept_once_and_a_changed_screen_is_an_error(tmp_path):
    claims = C.screen_claims(report(SCREEN))
    path = C.save_claims(claims, tmp_path)
    assert C.load_claims(tmp_path) == claims and json.loads(path.read_text())["rule"] == C.RULE
    C.save_claims(claims, tmp_path)  # the same claims again: fine
    other = dict(SCREEN)
    other[("a", "causal-spt")] = SCREEN[("a", "scratch")]
    with pytest.raises(ConfigError, match="holds other claims than the screen makes now"):
        C.save_claims(C.screen_claims(report(other)), tmp_path)
    path.write_text('{"models": ["a"], "tasks": [], "seeds": [0], "claims": [{"kind": "guess"}]}')
    with pytest.raises(ConfigError, match=r"mad_claims.json: claims\[0\].kind is 'guess'"):
        C.load_claims(tmp_path)
    path.write_text('{"models": ')
    with pytest.raises(ConfigError, match="mad_claims.json: damaged, not JSON"):
        C.load_claims(tmp_path)
    assert C.load_claims(tmp_path / "none") is None


def test_only_a_confirmation_takes_claims_to_test(tmp_path):
    st = M.MadSettings(models=("gated-deltanet",), tasks=("mad-memorization",), levels=("baseline",))
    claims = C.screen_claims(report(SCREEN))
    with pytest.raises(ConfigError, match="claims are tested by a confirmation"):
        R.run_mad(st, tmp_path, claims=claims, dry_run=True)
    assert not (tmp_path / C.CLAIMS_FILE).exists()
