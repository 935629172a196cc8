"""The claims a MAD screen makes and their test on a confirmation's fresh seeds, by the rule that
docs/recall-protocols.md fixed before the CPU study's screen was read.

A screen (``longrange mad --screen``, seeds 0-2) chooses; a confirmation (``--grid-from SCREEN``,
fresh seeds and data) tests. The rule turns the screen's scores into claims, mechanically:

1. ``spt``: for every model and task, and every model's overall score, causal SPT raises (or
   lowers) its MAD score, where the screen's mean paired difference (causal-spt minus scratch) is
   at least :data:`MIN_POINTS` points and every seed agrees in sign. Confirmed when the
   confirmation's mean difference has the claimed sign and its 95% Student-t interval excludes 0.
2. ``best``: model A has the best overall score in a regime, where A is best on every seed of the
   screen (a tie is not best). Confirmed when A has the best mean overall score in the
   confirmation and its paired difference from each other model has an interval above 0.
3. ``top``: self-pretraining changes (or keeps) the best model, by mean overall score in each
   regime. Confirmed when the confirmation's means say the same.

The screen writes its claims to ``mad_claims.json`` once every score is in; a confirmation copies
them into its own folder before it trains (a screen that has changed since is an error there), and
its report tests each. A claim whose models or tasks the confirmation does not run is reported as
not tested, never as confirmed or refuted.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from longrange.errors import ConfigError


class MadReport(Protocol):
    """What the rule reads of a study's report (:class:`longrange.studies.mad_report.MadReport`)."""

    settings: Any  # MadSettings: its models, tasks, regimes and seeds
    overall: Mapping[tuple[str, str, int], float | None]

    def _score(self, model: str, task: str, regime: str, seed: int) -> float | None: ...


#: A claim of rule 1 needs a mean difference of at least this many points of accuracy.
MIN_POINTS = 5.0
CLAIMS_FILE = "mad_claims.json"
RULE = 'docs/recall-protocols.md ("The confirmation, fixed before the screen\'s results were read")'
OVERALL = "overall"
KINDS = ("spt", "best", "top")


@dataclass(frozen=True)
class Claim:
    """One claim of the screen: ``kind`` is ``spt`` (``model``, ``task``: ``direction`` ``raises`` or
    ``lowers``), ``best`` (``model`` best in ``regime``) or ``top`` (``direction`` ``changes`` or
    ``keeps``: the best model between the regimes); ``screen`` says what the screen measured."""

    kind: str
    direction: str = ""
    model: str = ""
    task: str = ""
    regime: str = ""
    screen: str = ""

    def text(self) -> str:
        if self.kind == "spt":
            what = "its overall score" if self.task == OVERALL else self.task
            return f"causal SPT {self.direction} {self.model} on {what}"
        if self.kind == "best":
            return f"{self.model} is the best model overall in {self.regime}"
        return f"self-pretraining {self.direction} the best model overall"


@dataclass(frozen=True)
class Claims:
    """The screen's claims with what they were taken from (its models, tasks and seeds)."""

    models: tuple[str, ...]
    tasks: tuple[str, ...]
    seeds: tuple[int, ...]
    claims: tuple[Claim, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": RULE,
            "models": list(self.models),
            "tasks": list(self.tasks),
            "seeds": list(self.seeds),
            "claims": [asdict(c) for c in self.claims],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = CLAIMS_FILE) -> Claims:
        try:
            claims = tuple(Claim(**entry) for entry in data["claims"])
            out = cls(tuple(data["models"]), tuple(data["tasks"]), tuple(int(s) for s in data["seeds"]), claims)
        except (KeyError, TypeError, ValueError) as err:
            raise ConfigError(f"{where}: not a MAD screen's claims ({err!r})") from err
        for i, claim in enumerate(out.claims):
            if claim.kind not in KINDS:
                raise ConfigError(f"{where}: claims[{i}].kind is {claim.kind!r}, not one of {', '.join(KINDS)}")
        return out


@dataclass(frozen=True)
class Tested:
    """A claim against a confirmation: ``verdict`` is ``confirmed``, ``not confirmed`` or
    ``not tested``; ``measured`` what the confirmation measured (or why it could not)."""

    claim: Claim
    verdict: str
    measured: str
    #: An SPT claim's two-sided paired t-test p-value (not part of the rule; for the Holm line).
    p: float | None = None


def _score(report: MadReport, model: str, task: str, regime: str, seed: int) -> float | None:
    if task == OVERALL:
        return report.overall.get((model, regime, seed))
    return report._score(model, task, regime, seed)


def missing_scores(report: MadReport) -> list[str]:
    """Every (model, task, regime, seed) of the study without a score, as text."""
    st = report.settings
    return [
        f"{model} {task} {regime} seed {seed}"
        for model in st.models
        for task in st.tasks
        for regime in st.regimes
        for seed in st.seeds
        if _score(report, model, task, regime, seed) is None
    ]


def spt_differences(report: MadReport, model: str, task: str) -> list[float]:
    """causal-spt minus scratch in points for ``model`` on ``task`` (or :data:`OVERALL`), paired by
    seed (seeds without both are left out)."""
    out = []
    for seed in report.settings.seeds:
        a = _score(report, model, task, "causal-spt", seed)
        b = _score(report, model, task, "scratch", seed)
        if a is not None and b is not None:
            out.append(100.0 * (a - b))
    return out


def _best_by_mean(report: MadReport, regime: str) -> tuple[tuple[str, ...], dict[str, float]]:
    """The model(s) with the best mean overall score in ``regime`` (several on an exact tie)."""
    st = report.settings
    means = {}
    for model in st.models:
        values = [_score(report, model, OVERALL, regime, seed) for seed in st.seeds]
        means[model] = math.fsum(values) / len(values)  # complete: checked by the callers
    top = max(means.values())
    return tuple(m for m in st.models if means[m] == top), means


def screen_claims(report: MadReport) -> Claims:
    """The claims of a finished screen by the rule (module docstring); an error naming what is
    missing unless every model has a score for every task, regime and seed."""
    st = report.settings
    missing = missing_scores(report)
    if missing:
        raise ConfigError(
            f"the screen is not finished: {len(missing)} scores are missing, e.g. {missing[0]}; its claims are "
            "taken once every score is in"
        )
    claims: list[Claim] = []
    both = {"scratch", "causal-spt"} <= set(st.regimes)
    if both:
        for model in st.models:
            for task in (*st.tasks, OVERALL):
                d = spt_differences(report, model, task)
                mean = math.fsum(d) / len(d)
                agree = all(x > 0 for x in d) or all(x < 0 for x in d)
                if agree and abs(mean) >= MIN_POINTS:
                    claims.append(
                        Claim(
                            "spt",
                            "raises" if mean > 0 else "lowers",
                            model,
                            task,
                            screen=f"{mean:+.1f} points, {len(d)} of {len(d)} seeds agreeing",
                        )
                    )
    for regime in st.regimes:
        winners = set()
        for seed in st.seeds:
            values = {m: _score(report, m, OVERALL, regime, seed) for m in st.models}
            top = max(values.values())
            best = [m for m, v in values.items() if v == top]
            winners.add(best[0] if len(best) == 1 else None)
        if len(st.models) > 1 and len(winners) == 1 and None not in winners:
            (model,) = winners
            claims.append(Claim("best", model=model, regime=regime, screen=f"best on all {len(st.seeds)} seeds"))
    if both and len(st.models) > 1:
        spt, _ = _best_by_mean(report, "causal-spt")
        scratch, _ = _best_by_mean(report, "scratch")
        claims.append(
            Claim(
                "top",
                "changes" if spt != scratch else "keeps",
                screen=f"best by mean: {' = '.join(scratch)} from scratch, {' = '.join(spt)} with causal SPT",
            )
        )
    return Claims(tuple(st.models), tuple(st.tasks), tuple(st.seeds), tuple(claims))


def check_claims(claims: Claims, report: MadReport) -> list[Tested]:
    """Each claim against the scores of ``report`` (a confirmation on fresh seeds)."""
    from longrange.report.verdict import paired_stat

    st = report.settings
    same_tasks = tuple(st.tasks) == claims.tasks
    same_models = set(st.models) == set(claims.models)
    out = []
    for claim in claims.claims:
        why = None
        if claim.kind == "spt":
            if claim.model not in st.models:
                why = f"{claim.model} is not in the confirmation"
            elif claim.task == OVERALL and not same_tasks:
                why = "the confirmation's overall score is over other tasks"
            elif claim.task != OVERALL and claim.task not in st.tasks:
                why = f"{claim.task} is not in the confirmation"
            elif not {"scratch", "causal-spt"} <= set(st.regimes):
                why = "the confirmation does not run both regimes"
        elif not (same_tasks and same_models):
            why = "the confirmation runs other models or tasks than the screen"
        elif claim.kind == "best" and claim.regime not in st.regimes:
            why = f"the confirmation does not run {claim.regime}"
        elif claim.kind == "top" and not {"scratch", "causal-spt"} <= set(st.regimes):
            why = "the confirmation does not run both regimes"
        if why is None:
            models = (claim.model,) if claim.kind == "spt" else st.models
            tasks = (claim.task,) if claim.kind == "spt" and claim.task != OVERALL else st.tasks
            regimes = (claim.regime,) if claim.kind == "best" else ("scratch", "causal-spt")
            gaps = [
                (m, t, r, s)
                for m in models
                for t in tasks
                for r in regimes
                for s in st.seeds
                if _score(report, m, t, r, s) is None
            ]
            if gaps:
                m, t, r, s = gaps[0]
                why = f"{len(gaps)} scores are missing, e.g. {m} {t} {r} seed {s}"
        if why is not None:
            out.append(Tested(claim, "not tested", why))
            continue
        if claim.kind == "spt":
            stat = paired_stat(spt_differences(report, claim.model, claim.task))
            sign = 1.0 if claim.direction == "raises" else -1.0
            ok = stat.low is not None and (stat.low > 0 if sign > 0 else stat.high < 0)
            measured = f"{stat.mean:+.1f} points" + (
                f" [{stat.low:+.1f}, {stat.high:+.1f}]" if stat.low is not None else " (one seed: no interval)"
            )
            out.append(Tested(claim, "confirmed" if ok else "not confirmed", measured, stat.p))
        elif claim.kind == "best":
            top, means = _best_by_mean(report, claim.regime)
            lows = {}
            for other in st.models:
                if other == claim.model:
                    continue
                d = [
                    100.0
                    * (
                        _score(report, claim.model, OVERALL, claim.regime, s)
                        - _score(report, other, OVERALL, claim.regime, s)
                    )
                    for s in st.seeds
                ]
                lows[other] = paired_stat(d).low
            ok = top == (claim.model,) and all(low is not None and low > 0 for low in lows.values())
            closest = min(lows, key=lambda m: -math.inf if lows[m] is None else lows[m])
            low = lows[closest]
            measured = (
                f"best by mean: {' = '.join(top)} ({100 * means[top[0]]:.1f}); {claim.model} minus {closest}: lower "
                + ("bound undefined (one seed)" if low is None else f"bound {low:+.1f} points")
            )
            out.append(Tested(claim, "confirmed" if ok else "not confirmed", measured))
        else:
            spt, _ = _best_by_mean(report, "causal-spt")
            scratch, _ = _best_by_mean(report, "scratch")
            changes = spt != scratch
            ok = changes == (claim.direction == "changes")
            measured = f"best by mean: {' = '.join(scratch)} from scratch, {' = '.join(spt)} with causal SPT"
            out.append(Tested(claim, "confirmed" if ok else "not confirmed", measured))
    return out


def claims_lines(claims: Claims) -> list[str]:
    """The screen's claims as a Markdown section."""
    lines = ["## Claims for a confirmation", "", f"By the rule of {RULE}:", ""]
    if not claims.claims:
        return [*lines, "None: no difference or ranking met the rule.", ""]
    lines += ["| claim | the screen |", "|---|---|"]
    lines += [f"| {c.text()} | {c.screen} |" for c in claims.claims]
    return [*lines, ""]


def tested_lines(tested: Sequence[Tested], claims: Claims) -> list[str]:
    """A confirmation's test of the screen's claims as a Markdown section."""
    lines = [
        f"## The screen's claims (seeds {', '.join(map(str, claims.seeds))}), tested",
        "",
    ]
    if not tested:
        return [*lines, "The screen made no claims.", ""]
    lines += ["| claim | the screen | this study | verdict |", "|---|---|---|---|"]
    lines += [f"| {t.claim.text()} | {t.claim.screen} | {t.measured} | {t.verdict} |" for t in tested]
    counts = {v: sum(t.verdict == v for t in tested) for v in ("confirmed", "not confirmed", "not tested")}
    lines += [
        "",
        f"{counts['confirmed']} confirmed, {counts['not confirmed']} not confirmed, "
        f"{counts['not tested']} not tested, of {len(tested)} claims.",
    ]
    lines += _holm_line(tested)
    return [*lines, ""]


def _holm_line(tested: Sequence[Tested]) -> list[str]:
    """How many confirmed SPT claims also hold with the family-wise error of all the SPT claims
    tested held at 5% (Holm's adjustment of their paired t-tests): not part of the rule, which
    tests each claim at 95% on its own; reported so that many claims are read as many tests."""
    from longrange.report.verdict import FAMILY_ALPHA, holm

    spt = [t for t in tested if t.claim.kind == "spt" and t.verdict != "not tested" and t.p is not None]
    if not spt:
        return []
    decisions = holm([t.p for t in spt], FAMILY_ALPHA)
    held = sum(rejected for t, (_, rejected) in zip(spt, decisions) if t.verdict == "confirmed")
    confirmed = sum(t.verdict == "confirmed" for t in spt)
    return [
        "",
        f"Of the {confirmed} SPT claims confirmed, {held} also hold under Holm's adjustment over the "
        f"{len(spt)} SPT claims tested (paired t-tests, family-wise error {FAMILY_ALPHA:g}); the rule tests "
        "each claim on its own at 95%.",
    ]


def save_claims(claims: Claims, out_dir: str | Path) -> Path:
    """``OUT/mad_claims.json``; other claims already there are an error (the screen they came from
    has changed), never overwritten."""
    from longrange.fileio import atomic_write

    path = Path(out_dir) / CLAIMS_FILE
    if path.is_file() and load_claims(out_dir) != claims:
        raise ConfigError(
            f"{path} holds other claims than the screen makes now: the screen has changed since they were "
            "taken; a confirmation tests the claims it started with"
        )
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    return atomic_write(path, (json.dumps(claims.to_dict(), indent=1) + "\n").encode())


def load_claims(out_dir: str | Path) -> Claims | None:
    """The claims in ``OUT/mad_claims.json``; None where there is no such file."""
    path = Path(out_dir) / CLAIMS_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except ValueError as err:
        raise ConfigError(f"{path}: damaged, not JSON ({err})") from err
    return Claims.from_dict(data, str(path))


__all__ = [
    "CLAIMS_FILE",
    "MIN_POINTS",
    "Claim",
    "Claims",
    "Tested",
    "check_claims",
    "claims_lines",
    "load_claims",
    "missing_scores",
    "save_claims",
    "screen_claims",
    "spt_differences",
    "tested_lines",
]
