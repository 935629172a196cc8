"""The extrapolation sweep: finished runs evaluated at other values of a task option, as a table
(Markdown, JSON, CSV) and a plot; refusals as cells with their reason; metrics passed through."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from PIL import Image

from longrange.cli import main
from longrange.data.tasks import TASKS, SequenceDataset, TaskData, TaskSpec, register_task
from longrange.data.tokenize import EOS_ID, Vocabulary
from longrange.errors import ConfigError
from longrange.experiment.config import experiment_from_dict
from longrange.experiment.execute import run_stage
from longrange.experiment.stage import resolve_stage
from longrange.report.extrapolation import RunRow, Sweep, ValueResult, option_sweep, sweep_table, write_sweep
from longrange.train.trained import load_run

TASK = "toy-length"


def toy_spec(seq_len: int = 16) -> TaskSpec:
    if seq_len < 2:
        raise ConfigError(f"{TASK} option seq_len must be >= 2, got {seq_len}")
    return TaskSpec(name=TASK, input_kind="tokens", seq_len=seq_len, n_classes=2, metric="accuracy", mask_ratio=0.1)


def toy_load(data_dir, spec, seed=0, skip_bad=False, seq_len=16) -> TaskData:
    """Sequences of exactly ``seq_len`` positions (tokens a, b, c and <eos>); the label says
    whether the first token is an a. Generated from the seed and the length."""

    def split(n: int, offset: int) -> SequenceDataset:
        gen = torch.Generator().manual_seed(1000 * seed + 10 * offset + seq_len)
        tokens = torch.randint(5, 8, (n, seq_len - 1), generator=gen)
        eos = torch.full((n, 1), EOS_ID)
        return SequenceDataset(list(torch.cat([tokens, eos], 1)), (tokens[:, 0] == 5).long())

    return TaskData(spec, split(32, 0), split(12, 1), split(12, 2), vocab=Vocabulary(["a", "b", "c"], strict=True))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A test-only generated task whose data change with seq_len, a Simple-S6 run and a Transformer
    with a learned position table of 16 positions, both trained at seq_len 16."""
    register_task(TASK, toy_spec, toy_load, {"seq_len": 16})
    root = tmp_path_factory.mktemp("extrapolation")

    def experiment(**model):
        return experiment_from_dict(
            {
                "label": model.pop("label"),
                "task": {"name": TASK, "options": {"seq_len": 16}, "data_dir": str(root)},
                "model": {"n_layers": 1, "d_model": 8, "d_state": 4, **model},
                "train": {"batch_size": 8, "max_steps": 3, "lr": 0.003, "progress": False, "log_every": 1},
            }
        )

    run_stage(
        resolve_stage(experiment(label="S6", block="simple", primitive="s6", direction="causal"), "train"), root / "s6"
    )
    run_stage(
        resolve_stage(
            experiment(
                label="attention",
                block="transformer",
                primitive="attention",
                n_heads=2,
                direction="causal",
                pos_embedding="learned",
                max_len=16,
            ),
            "train",
        ),
        root / "attention",
    )
    yield root
    TASKS.unregister(TASK)


def test_sweep_writes_table_json_csv_and_plot(runs, tmp_path):
    s6, attention = load_run(runs / "s6"), load_run(runs / "attention")
    values = [8, 16, 32, 64]
    sweep = option_sweep([s6, attention], "seq_len", values, progress=lambda line: None)
    paths = write_sweep(sweep, tmp_path / "out")
    assert sorted(p.name for p in paths.values()) == [
        "extrapolation.csv",
        "extrapolation.json",
        "extrapolation.md",
        "extrapolation.png",
    ]
    data = json.loads(paths["json"].read_text())
    assert data["option"] == "seq_len" and data["values"] == values
    s6_row, attention_row = data["runs"]
    assert s6_row["trained_at"] == 16 and s6_row["metric"] == "accuracy"
    for cell, value in zip(s6_row["cells"], values):  # each cell is the run's own evaluation at that value
        assert cell["error"] is None
        assert cell["metrics"] == s6.evaluate("test", {"seq_len": value}).metrics
    # The position table ends at 16: longer values are refused with the limit named, the sweep goes on.
    assert [c["error"] is None for c in attention_row["cells"]] == [True, True, False, False]
    assert (
        "model.max_len" in attention_row["cells"][2]["error"] and "64 positions" in attention_row["cells"][3]["error"]
    )
    markdown = paths["markdown"].read_text()
    assert "| Run | Task | Trained at seq_len | 8 | 16 | 32 | 64 |" in markdown
    s6_line = next(line for line in markdown.splitlines() if line.startswith("| S6, seed 0 "))
    accuracy = 100 * s6_row["cells"][1]["metrics"]["accuracy"]
    assert f"| {accuracy:.2f}* |" in s6_line  # the training value is marked
    attention_line = next(line for line in markdown.splitlines() if line.startswith("| attention, seed 0 "))
    assert attention_line.endswith("| — (1) | — (2) |") and "- (1) the model of" in markdown
    assert "![seq_len sweep](extrapolation.png)" in markdown
    rows = list(csv.DictReader(paths["csv"].open()))
    assert len(rows) == 8 and {r["value"] for r in rows} == {"8", "16", "32", "64"}
    assert rows[0]["accuracy"] == str(s6_row["cells"][0]["metrics"]["accuracy"])
    with Image.open(paths["plot"]) as image:
        assert image.format == "PNG" and image.size[0] > 400


def test_extrapolate_command(runs, tmp_path, capsys):
    out = tmp_path / "cli"
    assert (
        main(
            [
                "extrapolate",
                str(runs / "s6"),
                str(runs / "attention"),
                "--option",
                "seq_len",
                "--values",
                "8,16,32",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr()
    assert "| Trained at seq_len | 8 | 16 | 32 |" in printed.out
    assert (out / "extrapolation.png").is_file() and (out / "extrapolation.md").is_file()
    assert main(["extrapolate", str(runs / "s6"), "--option", "length", "--values", "8", "--out", str(out)]) == 1
    assert "unknown option 'length' for task toy-length" in capsys.readouterr().err
    assert main(["extrapolate", str(runs / "s6"), "--values", "8,long", "--out", str(out)]) == 1
    assert "task option seq_len: expected an integer, got 'long'" in capsys.readouterr().err
    assert main(["extrapolate", str(runs / "s6"), "--values", "8,1", "--out", str(out)]) == 1
    assert "seq_len must be >= 2, got 1" in capsys.readouterr().err


def test_evaluate_with_a_task_option_on_the_generated_task(runs):
    run = load_run(runs / "s6")
    ev = run.evaluate("test", {"seq_len": 48})
    assert ev.changed == {"seq_len": 48} and ev.items == 12
    assert ev.memory.endswith("per sequence of length 48")


class FakeRun:
    """A run whose objective reports more than one metric (e.g. per token and per sequence)."""

    def __init__(self, name: str):
        self.root, self.label, self.task_name, self.summary = name, name, "fake", {"metric": "accuracy"}

    def options(self, changes=None):
        if changes and changes.get("seq_len", 1) < 1:
            raise ConfigError("fake option seq_len must be positive")
        return {"seq_len": 4, **(changes or {})}

    def evaluate(self, split, options, **kwargs):
        from longrange.train.trained import Evaluation

        n = options["seq_len"]
        metrics = {"loss": 1.0 / n, "accuracy": 4 / (4 + n), "sequence_accuracy": 1 / n, "token_count": float(n)}
        return Evaluation(
            run=self.root,
            task="fake",
            split=split,
            options=options,
            changed={},
            metric="accuracy",
            metrics=metrics,
            items=3,
            length=n,
            batch_size=3,
            memory="",
            device="cpu",
            precision="fp32",
            seconds=0.0,
        )


def test_every_metric_of_an_objective_flows_through_unchanged(tmp_path):
    sweep = option_sweep(
        [FakeRun("a"), FakeRun("b")], "seq_len", [4, 8], metric="sequence_accuracy", progress=lambda line: None
    )
    paths = write_sweep(sweep, tmp_path, plot=True)
    data = json.loads(paths["json"].read_text())
    assert data["runs"][0]["cells"][1]["metrics"] == {
        "loss": 1 / 8,
        "accuracy": 4 / 12,
        "sequence_accuracy": 1 / 8,
        "token_count": 8.0,
    }
    header = paths["csv"].read_text().splitlines()[0]
    assert header.startswith("run,label,task,split,option,value,trained_at,accuracy,loss,sequence_accuracy,token_count")
    table = sweep_table(sweep)
    assert table.rows[0][3:] == ["25.00*", "12.50"]  # the chosen metric (in percent), the training value marked
    with pytest.raises(ConfigError, match="metric 'f1' is not reported by a, b"):
        option_sweep([FakeRun("a"), FakeRun("b")], "seq_len", [4], metric="f1", progress=lambda line: None)
    with pytest.raises(ConfigError, match="fake option seq_len must be positive"):
        option_sweep([FakeRun("a")], "seq_len", [4, 0], progress=lambda line: None)


def test_table_of_a_sweep_with_no_evaluated_cell_still_renders():
    row = RunRow("r", "r", "t", "accuracy", 16, [ValueResult(32, error="too long"), ValueResult(64, error="too long")])
    table = sweep_table(Sweep("seq_len", [32, 64], "test", {}, [row]))
    assert table.rows == [["r", "t", "16", "— (1)", "— (1)"]] and table.notes == ["- (1) too long"]
