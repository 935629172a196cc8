"""What a researcher reads: mismatches named as the experiment sets them, Ctrl-C without a traceback,
how each command resumes, finished runs called finished, plugins named in unknown-name errors,
stages announced in order with a steady ETA, accuracy in percent, presets grouped and short."""

from __future__ import annotations

import importlib
import os
import re
import signal

import pytest

from longrange.cli import main
from longrange.errors import ConfigError, Preempted
from longrange.experiment import scheduler as S
from longrange.experiment.config import experiment_from_dict, list_presets
from longrange.experiment.execute import run_stage
from longrange.experiment.plan import plan_grid
from longrange.experiment.scheduler import Outcome, run_plan
from longrange.experiment.stage import resolve_stage
from longrange.train.rundir import Intent, RunDir, RunMismatchError

compare_module = importlib.import_module("longrange.experiment.compare")


def _exp(**sections):
    return experiment_from_dict(
        {
            "label": "m",
            "task": {"name": "listops", "options": {"seq_len": 32}},
            "model": {"block": "simple", "primitive": "s4d", "d_model": 8},
            "train": {"epochs": 20},
            **sections,
        }
    )


def test_a_mismatch_is_named_as_the_experiment_sets_it(tmp_path):
    """pretrain.epochs changed: said as pretrain.epochs, not as the resolved stage's train.epochs."""
    old = resolve_stage(_exp(pretrain={"epochs": 20}), "pretrain", objective="masked")
    run = RunDir(tmp_path / "pre")
    run.write_config(old.config())
    run.write_summary({"steps": 1})
    new = resolve_stage(_exp(pretrain={"epochs": 30}, pretrain_model={"dropout": 0.2}), "pretrain", objective="masked")
    with pytest.raises(RunMismatchError) as err:
        run_stage(new, run.root, Intent("continue"))
    text = str(err.value)
    assert "pretrain.epochs: 20 -> 30" in text and "pretrain_model.dropout: 0.0 -> 0.2" in text
    assert "train.epochs" not in text.replace("pretrain.epochs", "")
    # a field the stage takes from `train` keeps its name; so does every field of a scratch stage
    inherited = resolve_stage(_exp(train={"epochs": 30}), "pretrain", objective="masked")
    assert inherited.name_fields("x: train.epochs: 20 -> 30") == "x: train.epochs: 20 -> 30"
    scratch = resolve_stage(_exp(pretrain={"epochs": 30}), "train")
    assert (
        scratch.name_fields("train.epochs: 20 -> 30; model.d_model: 8 -> 9")
        == "train.epochs: 20 -> 30; model.d_model: 8 -> 9"
    )


def test_compare_names_a_stale_pretraining_stage_by_its_section(tmp_path):
    exp = _exp(pretrain={"epochs": 20})
    plan = plan_grid([exp], seeds=[0], objectives=["masked"], compute_matched=False)
    stage = next(s for s in plan.stages if s.stage == "pretrain")
    run = RunDir(tmp_path / stage.id)
    run.write_config(plan.resolve(stage, tmp_path).config())
    run.write_summary({"steps": 1})
    changed = plan_grid([_exp(pretrain={"epochs": 30})], seeds=[0], objectives=["masked"], compute_matched=False)
    with pytest.raises(RunMismatchError, match=r"seed0/pretrain: pretrain.epochs: 20 -> 30"):
        compare_module.check_reuse(changed, tmp_path)


def test_ctrl_c_ends_compare_with_its_message_and_no_traceback(tmp_path, monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        print("stopped 2 worker(s): ... resume from their last checkpoints")  # the comparison's own message
        raise KeyboardInterrupt

    monkeypatch.setattr(compare_module, "compare", interrupted)
    assert main(["compare", "--preset", "demo/s4d", "--out", str(tmp_path / "out")]) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.strip() == (
        "longrange compare: interrupted; run the same compare command again to continue (finished "
        "stages are reused, an interrupted one resumes from its checkpoint where it wrote one)"
    )
    assert "--resume" not in err  # compare has no --resume


def test_a_stopped_compare_stage_says_compare_resumes_it(tmp_path, monkeypatch, capsys):
    """stage.log of a worker stopped by compare (SIGTERM: a checkpoint, then Preempted)."""
    from longrange.experiment import execute, worker

    plan = plan_grid([_exp()], seeds=[0], objectives=["masked"], compute_matched=False)
    plan.save(tmp_path)

    def stopped(*args, **kwargs):
        raise Preempted(12, 300)

    monkeypatch.setattr(execute, "run_stage", stopped)
    assert worker.main([str(tmp_path), plan.stages[0].id]) == worker.INTERRUPTED
    err = capsys.readouterr().err
    assert (
        "stopped at step 12 of 300, its checkpoint written; it resumes when the same `longrange compare` runs again"
        in err
    )
    assert "--resume" not in err
    # a preempted compare in process: the same advice, not --resume
    monkeypatch.setattr(compare_module, "compare", stopped)
    assert main(["compare", "--preset", "demo/s4d", "--out", str(tmp_path / "out")]) == Preempted.PREEMPTED_EXIT
    err = capsys.readouterr().err
    assert "stopped at step 12 of 300 of a stage" in err and "run the same compare command again" in err
    assert "--resume" not in err
    # Ctrl-C in process: the stage checkpoints, the command says it was interrupted, exit 130
    import signal

    def interrupted(*args, **kwargs):
        raise Preempted(12, 300, signal=signal.SIGINT)

    monkeypatch.setattr(compare_module, "compare", interrupted)
    assert main(["compare", "--preset", "demo/s4d", "--out", str(tmp_path / "out")]) == 130
    err = capsys.readouterr().err
    assert (
        err.startswith(
            "longrange compare: interrupted at step 12 of 300 of a stage, its checkpoint written; run the "
            "same compare command again"
        )
        and "Traceback" not in err
    )


def test_a_new_run_on_a_finished_run_says_it_is_finished(tmp_path):
    run = RunDir(tmp_path / "run")
    run.write_config({"x": 1})
    run.write_summary({"steps": 3})
    with pytest.raises(
        ConfigError,
        match=r"already holds a finished run \(its result: .*summary.json\); pass "
        r"--overwrite to train it again, or choose a new --out",
    ) as err:
        run.decide({"x": 1}, Intent("new"))
    assert "--resume" not in str(err.value)
    unfinished = RunDir(tmp_path / "unfinished")
    unfinished.write_config({"x": 1})
    unfinished.metrics.write_text("{}\n")
    with pytest.raises(
        ConfigError, match=r"already holds an unfinished run \(metrics.jsonl\); pass --resume to continue"
    ):
        unfinished.decide({"x": 1}, Intent("new"))


def test_unknown_names_say_how_to_register_ones_own():
    from longrange.layers import PRIMITIVES
    from longrange.models import HEADS
    from longrange.models.config import ModelConfig

    for make in (
        lambda: ModelConfig(primitive="myconv"),
        lambda: ModelConfig(block="myblock"),
        lambda: PRIMITIVES.get("myconv"),
        lambda: HEADS.get("myhead"),
    ):
        with pytest.raises(
            ConfigError, match=r"LONGRANGE_PLUGINS=mypkg.module on the command line \(see docs/extending.md\)"
        ):
            make()


class _Clock:
    def __init__(self):
        self.t = 1000.0

    def time(self):
        return self.t

    def sleep(self, seconds):
        self.t += seconds


class _TimedBackend:
    """Runs each stage for a fixed time of a fake clock, two at once."""

    submits_ahead, wait, poll_interval = False, True, 1.0

    def __init__(self, clock, durations):
        self.clock, self.durations, self.ends = clock, durations, {}

    def begin(self, plan, out_dir, intent):
        pass

    def slots(self):
        return 2 - len(self.ends)

    def submit(self, stages, after):
        self.ends.update(
            {s.id: self.clock.t + self.durations[s.stage] * (2 if s.regime == "scratch-matched" else 1) for s in stages}
        )
        return {s.id: s.id for s in stages}

    def poll(self, handle):
        if self.clock.t < self.ends[handle]:
            return None
        del self.ends[handle]
        return Outcome.DONE

    def cancel(self, handle):
        pass

    def stop(self, handles, interrupted):
        pass

    def end(self, handles):
        pass


def test_stages_are_announced_in_order_with_a_steady_eta(tmp_path, monkeypatch):
    clock, said = _Clock(), []
    monkeypatch.setattr(S, "time", clock)
    monkeypatch.setattr(S, "say", lambda message: said.append((clock.t, message)))
    plan = plan_grid([_exp()], seeds=[0, 1, 2], objectives=["masked"])
    run_plan(plan, tmp_path, _TimedBackend(clock, {"train": 10, "pretrain": 14, "finetune": 8}))
    announced = [(t, re.match(r"stage (\d+) of 12: \S+ \((?:overall eta (\S+)|(.+))\)", m)) for t, m in said]
    announced = [(t, a) for t, a in announced if a]
    assert [int(a.group(1)) for _, a in announced] == list(range(1, 13))  # in the order they start
    first_end = min(t for t, m in said if re.match(r"\[1/12 done", m))
    # before any stage has ended: no number, and when there will be one (never "?")
    assert [a.group(3) for t, a in announced if t < first_end] == [S.NO_ETA_YET] * 2
    assert S.NO_ETA_YET == "overall eta: known when the first stage run here ends"
    assert all(a.group(2) for t, a in announced if t >= first_end)  # then an estimate at every announcement
    etas = [(t, a.group(2)) for t, a in announced if a.group(2)]

    def seconds(text):
        m = re.fullmatch(r"(?:(\d+)m)?(\d+)s", text)
        return 60 * int(m.group(1) or 0) + int(m.group(2))

    for (t0, a), (t1, b) in zip(etas, etas[1:]):  # no jumps: each estimate follows from the one before
        assert 0.75 * (seconds(a) - (t1 - t0)) <= seconds(b) <= 1.25 * seconds(a) + 1, (a, b)


class _BlockingBackend(_TimedBackend):
    """Runs each stage inside ``submit``, as the in-process backend does, one at a time."""

    def slots(self):
        return 1

    def submit(self, stages, after):
        for s in stages:
            self.clock.t += self.durations[s.stage]
        return {s.id: s.id for s in stages}

    def poll(self, handle):
        return Outcome.DONE


def test_the_eta_counts_stages_that_run_inside_submit(tmp_path, monkeypatch):
    """In process, a stage runs inside the backend's submit: its time counts (an estimate of 0 s
    while stages of 10 s remain would be a lie)."""
    clock, said = _Clock(), []
    monkeypatch.setattr(S, "time", clock)
    monkeypatch.setattr(S, "say", lambda message: said.append((clock.t, message)))
    plan = plan_grid([_exp()], seeds=[0, 1], objectives=["masked"], compute_matched=False)
    run_plan(plan, tmp_path, _BlockingBackend(clock, {"train": 10, "pretrain": 10, "finetune": 10}))
    etas = [re.search(r"\(overall eta (\d+)s\)", m) for _, m in said]
    etas = [int(e.group(1)) for e in etas if e]
    assert etas == [50, 40, 30, 20, 10]  # six stages of 10 s, one at a time


def test_validation_accuracy_is_shown_in_percent(capsys):
    from longrange.train.progress import Progress

    progress = Progress(True, 100, "accuracy")
    progress.start(0)
    progress.validated(10, {"accuracy": 0.2316, "loss": 2.0412})
    assert capsys.readouterr().err.strip() == "step 10/100: val accuracy 23.16%, loss 2.041"
    assert progress.val == "val accuracy 23.16%"
    # per-position tasks: the sequence accuracy in percent too, as the reports show it
    progress = Progress(True, 100, "accuracy")
    progress.validated(10, {"accuracy": 0.5, "sequence_accuracy": 0.125, "loss": 1.5})
    assert capsys.readouterr().err.strip() == "step 10/100: val accuracy 50.00%, sequence_accuracy 12.50%, loss 1.5"


def test_presets_are_grouped_labelled_and_short(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out.splitlines()
    heads = [line for line in out if line and not line.startswith(" ")]
    demo = [name for name in list_presets() if name.startswith("demo/")]
    assert heads[0].startswith(f"demo/ ({len(demo)} presets): the settings of `longrange demo`")
    assert "spt/ (" in "".join(heads) and any(
        "Amos, Berant & Gupta, Never Train from Scratch (ICLR 2024)" in h for h in heads
    )
    rows = [line for line in out if line.startswith("  ")]
    assert all(len(line) <= 160 for line in out) and "github" not in "\n".join(rows).lower()
    assert any(re.match(r"  spt/listops/s4 +listops +simple-s4 .* Table 2$", line) for line in rows)
    assert main(["presets", "spt/listops", "--long"]) == 0
    assert "source: Amos, Berant & Gupta" in capsys.readouterr().out


class _TerminatedBackend(_TimedBackend):
    """The fake-clock backend, whose process receives SIGTERM while its first stage runs."""

    stopped = None

    def poll(self, handle):
        if self.stopped is None:
            os.kill(os.getpid(), signal.SIGTERM)
        return super().poll(handle)

    def stop(self, handles, interrupted):
        self.stopped = (sorted(handles), interrupted)


def test_sigterm_stops_the_walk_as_ctrl_c_does_and_leaves_no_handler_behind(tmp_path, monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(S, "time", clock)
    monkeypatch.setattr(S, "say", lambda message: None)
    plan = plan_grid([_exp()], seeds=[0], objectives=["masked"])
    backend = _TerminatedBackend(clock, {"train": 10, "pretrain": 14, "finetune": 8})
    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as in a fresh `longrange compare` process
    try:
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            run_plan(plan, tmp_path, backend)
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, before)
    running, interrupted = backend.stopped
    assert running and interrupted  # the running stages are stopped as on Ctrl-C (workers checkpoint)
    # a handler installed by someone else (submitit's, a training loop's) is left in place
    mine = lambda signum, frame: None  # noqa: E731
    previous = signal.signal(signal.SIGTERM, mine)
    try:
        with S.terminate_as_interrupt():
            assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)
