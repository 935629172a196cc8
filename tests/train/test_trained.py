"""Using a trained run: load_run, predict on new inputs in the task's format, evaluate at the run's
own task options (equal to its summary) and at others, and the errors of each."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from longrange.cli import main
from longrange.data.listops import listops_vocabulary
from longrange.errors import ConfigError, DataFormatError, DataMissingError
from longrange.experiment.config import experiment_from_dict
from longrange.experiment.execute import run_stage
from longrange.experiment.stage import resolve_stage
from longrange.train.memory import MemoryBudgetError
from longrange.train.rundir import RunDir, UnfinishedRunError
from longrange.train.trained import TrainedRun, input_length_limit, load_model, load_run


def tiny(data_dir, **model) -> dict:
    m = dict(block="simple", primitive="s4d", n_layers=1, d_model=8, d_state=4, direction="bidirectional")
    m.update(model)
    return {
        "label": "tiny",
        "task": {"name": "listops", "options": {"seq_len": 32}, "data_dir": str(data_dir)},
        "model": m,
        "train": {"batch_size": 16, "eval_batch_size": 8, "epochs": 1, "lr": 0.003, "progress": False, "log_every": 2},
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A tiny ListOps (8-24 tokens), a Simple-S4D run on it and a Transformer run with a learned
    position table of 32 positions."""
    from longrange.data.generate.listops import generate

    root = tmp_path_factory.mktemp("trained")
    generate(
        root / "data" / "listops",
        n_train=48,
        n_val=16,
        n_test=20,
        min_length=8,
        max_length=24,
        max_depth=3,
        max_args=3,
        seed=0,
        quiet=True,
    )
    run_stage(resolve_stage(experiment_from_dict(tiny(root / "data")), "train"), root / "s4d")
    run_stage(
        resolve_stage(
            experiment_from_dict(
                tiny(
                    root / "data",
                    block="transformer",
                    primitive="attention",
                    n_heads=2,
                    direction="bidirectional",
                    pos_embedding="learned",
                    max_len=32,
                )
            ),
            "train",
        ),
        root / "attention",
    )
    return root


LISTOPS_FIXTURE = [  # the LRA file format: header, tab-separated, CRLF line endings
    "Source\tTarget",
    "( ( ( [MAX 4 ) 5 ) ] )\t5",
    "( ( ( [SM 4 ) 7 ) ] )\t1",
    "3\t3",
    "( ( ( ( [MED 1 ) 8 ) ( ( ( [MIN 2 ) 9 ) ] ) ) ] )\t2",
]


def write_tsv(path, lines, newline="\r\n"):
    path.write_bytes("".join(line + newline for line in lines).encode())
    return path


def test_load_run_gives_the_model_its_vocabulary_and_task(runs):
    run = load_run(runs / "s4d")
    assert isinstance(run, TrainedRun) and not run.model.training
    assert run.vocab == listops_vocabulary()  # saved in the run's record
    assert RunDir(runs / "s4d").read_config()["record"]["vocabulary"]["tokens"] == list(listops_vocabulary().tokens)
    assert run.spec.seq_len == 32 and run.task_name == "listops" and run.label == "tiny, seed 0"
    reloaded = load_model(runs / "s4d")  # the model alone, as the report's kernel analysis uses it
    for (name, a), (_, b) in zip(run.model.state_dict().items(), reloaded.state_dict().items()):
        assert torch.equal(a, b), name
    from longrange import load_run as exported
    from longrange.experiment import load_run as from_experiment

    assert exported is load_run is from_experiment


def test_evaluate_at_the_runs_own_options_equals_its_summary(runs):
    run = load_run(runs / "s4d")
    summary = RunDir(runs / "s4d").read_summary()
    test = run.evaluate("test")
    assert test.metrics == summary["test"]  # same weights, batches and order: the same sums
    assert test.summary == summary["test"] and test.same_data is True and test.changed == {}
    assert test.items == 20 and test.batch_size == 8 and test.metric == "accuracy"
    assert run.evaluate("val").metrics == summary["best_val"]


def test_a_run_on_generated_data_is_evaluated_on_that_data(tmp_path):
    # its files are under <data dir>/generated/, not where the task's own files would be
    exp = tiny(tmp_path / "data")
    exp["task"].update(generate={"config": "short", "n_train": 48, "n_val": 16, "n_test": 20}, options={"seq_len": 128})
    run_stage(resolve_stage(experiment_from_dict(exp), "train"), tmp_path / "run")
    assert not (tmp_path / "data" / "listops").exists()
    run = load_run(tmp_path / "run")
    summary = RunDir(tmp_path / "run").read_summary()
    test = run.evaluate("test")
    assert test.metrics == summary["test"] and test.items == 20
    assert main(["evaluate", str(tmp_path / "run"), "--split", "val"]) == 0


def test_evaluate_in_smaller_batches_under_a_memory_budget(runs):
    run = load_run(runs / "s4d")
    length = run.evaluate("test").length  # the longest test sequence (<eos> included)
    assert length == 1 + max(
        len(line.split("\t")[0].replace("(", " ").replace(")", " ").split())
        for line in (runs / "data" / "listops" / "basic_test.tsv").read_text().splitlines()[1:]
    )
    one = run.need(length).per_sequence(length)
    ev = run.evaluate("test", memory_budget=3 * one)
    assert ev.batch_size == 3
    summary = RunDir(runs / "s4d").read_summary()["test"]
    assert ev.metrics["accuracy"] == summary["accuracy"]
    assert ev.metrics["loss"] == pytest.approx(summary["loss"], rel=1e-6)
    with pytest.raises(MemoryBudgetError, match=r"more than the memory budget of .*--memory-budget"):
        run.evaluate("test", memory_budget=one // 2)


def test_evaluate_at_another_task_option(runs):
    run = load_run(runs / "s4d")
    longer = run.evaluate("test", {"seq_len": 64})  # the same files read with a higher limit
    assert longer.changed == {"seq_len": 64} and longer.options == {"seq_len": 64, "truncate": False}
    assert longer.summary is None and longer.same_data is None
    assert longer.metrics == run.evaluate("test").metrics
    cut = run.evaluate("test", {"seq_len": 6, "truncate": True})  # every source cut to 5 tokens + <eos>
    assert cut.items == 20 and cut.changed == {"seq_len": 6, "truncate": True}
    data = run._load_data(cut.options)
    assert max(int(item["inputs"].shape[0]) for item in data.test) == 6


def test_bad_task_options_and_splits_are_errors_naming_them(runs):
    run = load_run(runs / "s4d")
    with pytest.raises(
        ConfigError, match=r"unknown option 'seq_length' for task listops.*valid options: seq_len, truncate"
    ):
        run.evaluate("test", {"seq_length": 64})
    with pytest.raises(ConfigError, match=r"task option seq_len of task listops takes an integer, got 'long'"):
        run.evaluate("test", {"seq_len": "long"})
    with pytest.raises(ConfigError, match=r"seq_len must be >= 2, got 1"):
        run.evaluate("test", {"seq_len": 1})
    with pytest.raises(ConfigError, match=r"unknown split 'dev'"):
        run.evaluate("dev")
    with pytest.raises(ConfigError, match=r"device 'gpu'"):
        load_run(runs / "s4d", device="gpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"CUDA is not available here; use --device cpu"):
            load_run(runs / "s4d", device="cuda")


def test_a_length_beyond_a_learned_position_table_is_refused_naming_the_limit(runs, capsys):
    run = load_run(runs / "attention")
    assert input_length_limit(run.model)[0] == 32
    with pytest.raises(
        ConfigError,
        match=r"cannot take inputs of 64 positions \(seq_len=64\): its learned position "
        r"table has 32 positions \(model.max_len\).*at most 32",
    ):
        run.evaluate("test", {"seq_len": 64})
    assert main(["evaluate", str(runs / "attention"), "--task-option", "seq_len=64"]) == 1
    assert "model.max_len" in capsys.readouterr().err
    assert run.evaluate("test", {"seq_len": 24}).changed == {"seq_len": 24}  # shorter: fine


def test_a_directory_without_a_finished_run_is_refused(runs, tmp_path):
    with pytest.raises(DataMissingError, match="does not exist"):
        load_run(tmp_path / "nowhere")
    with pytest.raises(UnfinishedRunError, match="holds no run"):
        load_run(tmp_path)
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    shutil.copy(RunDir(runs / "s4d").config, RunDir(unfinished).config)
    with pytest.raises(UnfinishedRunError, match=r"has not finished \(no summary\).*--resume"):
        load_run(unfinished)
    failed = tmp_path / "failed"
    shutil.copytree(runs / "s4d", failed)
    RunDir(failed).summary.unlink()
    RunDir(failed).record_failure("TrainingDivergedError: loss became nan")
    with pytest.raises(UnfinishedRunError, match="failed.*loss became nan"):
        load_run(failed)
    # a failure recorded beside a summary is stale (the summary is the commit point): a result
    stale = tmp_path / "stale"
    shutil.copytree(runs / "s4d", stale)
    RunDir(stale).record_failure("the worker was killed by SIGKILL")
    assert load_run(stale).evaluate("val").metrics == load_run(runs / "s4d").evaluate("val").metrics
    assert main(["evaluate", str(unfinished)]) == 1


def test_predict_on_a_file_in_the_tasks_format(runs, tmp_path):
    run = load_run(runs / "s4d")
    labelled = write_tsv(tmp_path / "new.tsv", LISTOPS_FIXTURE)
    records = run.read_inputs(labelled)
    assert [r.id for r in records] == ["2", "3", "4", "5"]  # line numbers of the file
    predictions = run.predict(records)
    with torch.no_grad():  # one sequence at a time, no padding: the same classes
        direct = [int(run.model(r.item["inputs"][None]).argmax(-1)) for r in records]
    assert [p.value for p in predictions] == direct
    assert [p.target for p in predictions] == [5, 1, 3, 2]
    # The same sources without labels (header "Source" alone) give the same predictions.
    unlabelled = write_tsv(
        tmp_path / "sources.tsv", ["Source"] + [line.split("\t")[0] for line in LISTOPS_FIXTURE[1:]], "\n"
    )
    again = run.predict(run.read_inputs(unlabelled))
    assert [p.value for p in again] == direct and all(p.target is None for p in again)
    out = tmp_path / "predictions.tsv"
    assert main(["predict", str(runs / "s4d"), "--input", str(labelled), "--output", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert lines[0] == "id\tprediction\ttarget"
    assert lines[1:] == [f"{i}\t{p}\t{t}" for i, p, t in zip(range(2, 6), direct, [5, 1, 3, 2])]


def test_predict_errors_name_the_file_and_line(runs, tmp_path, capsys):
    run = load_run(runs / "s4d")
    bad = write_tsv(tmp_path / "bad.tsv", ["Source", "( ( [MAX 4 ) 5 ) ] )", "( [FOO 4 ) ] )"])
    with pytest.raises(DataFormatError, match=r"bad.tsv, line 3: token '\[FOO'"):
        run.read_inputs(bad)
    header = write_tsv(tmp_path / "header.tsv", ["Input", "3"])
    assert main(["predict", str(runs / "s4d"), "--input", str(header)]) == 1
    assert "header.tsv, line 1: expected the header 'Source<TAB>Target'" in capsys.readouterr().err
    long = write_tsv(tmp_path / "long.tsv", ["Source", " ".join(["( [SM 1 )"] * 20 + ["] )"])])
    with pytest.raises(DataFormatError, match=r"long.tsv, line 2: 41 tokens \+ <eos> exceed seq_len 32"):
        run.read_inputs(long)
    assert len(run.read_inputs(long, {"seq_len": 64})) == 1


def test_evaluate_command_prints_and_writes_the_metrics(runs, tmp_path, capsys):
    out = tmp_path / "eval.json"
    assert main(["evaluate", str(runs / "s4d"), "--split", "test", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "listops test split at the run's own task options: 20 items" in printed
    assert "the run's summary (equal)" in printed
    written = json.loads(out.read_text())
    assert written["metrics"] == RunDir(runs / "s4d").read_summary()["test"]
    from longrange.inference_cli import summary_agreement

    assert summary_agreement({"accuracy": 0.5, "loss": 1.0}, {"accuracy": 0.5, "loss": 1.0}) == "equal"
    assert summary_agreement({"accuracy": 0.5, "loss": 1.0}, {"accuracy": 0.5, "loss": 1.000001}).startswith(
        "equal up to"
    )
    assert summary_agreement({"accuracy": 0.5, "loss": 1.0}, {"accuracy": 0.55, "loss": 1.0}) == "DIFFERENT"
    assert main(["evaluate", str(runs / "s4d"), "-o", "seq_len=64,128"]) == 1
    assert "longrange extrapolate RUN --option seq_len --values 64,128" in capsys.readouterr().err
