"""``benchmarks/synthetic_tables.py`` runs end to end at toy sizes (``--tiny``): every grid trains through
the experiment layer's plan and local workers, induction heads are evaluated at other lengths through
``longrange extrapolate``, and the raw results (JSON), the Markdown tables and the plots are written;
a second command reads the same results back without training (no accuracies or timings asserted)."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "synthetic_tables.py"


def _module():
    spec = importlib.util.spec_from_file_location("synthetic_tables", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_script_runs_every_table_end_to_end_at_toy_size(tmp_path, capsys):
    st = _module()
    out, results = tmp_path / "runs", tmp_path / "results"
    assert st.main(["all", "--tiny", "--out", str(out), "--results", str(results)]) == 0
    printed = capsys.readouterr().out
    for title in ("Table 1", "against length", "Table 11", "Figure 2"):
        assert title in printed
    for name in ("table1", "lengths", "induction", "mqar"):
        assert (results / f"synthetic_{name}.md").is_file()
        runs = json.loads((results / f"synthetic_{name}.json").read_text())["runs"]
        assert runs and all(r["state"] == "finished" and 0.0 <= r["test_accuracy"] <= 1.0 for r in runs), name
        assert all(r["steps"] == 2 and r["seconds"] is not None for r in runs)
    assert (results / "synthetic_lengths.png").stat().st_size > 0 and (results / "synthetic_induction.png").stat().st_size > 0
    lengths = json.loads((results / "synthetic_lengths.json").read_text())["runs"]
    assert sorted({r["seq_len"] for r in lengths}) == st.TINY.lengths
    table1 = json.loads((results / "synthetic_table1.json").read_text())["runs"]
    shared = {r["run"] for r in table1} & {r["run"] for r in lengths}
    assert len(shared) == len(st.TINY.length_models)  # the length-24 runs are table1's, trained once
    induction = json.loads((results / "synthetic_induction.json").read_text())
    ext = induction["extrapolation"]
    attention = [e for e in ext if e["model"] == "attention-abs"]
    mamba = [e for e in ext if e["model"] == "mamba-s6"]
    assert sorted(e["seq_len"] for e in mamba) == st.TINY.extrapolation  # the SSM at every length
    assert max(e["seq_len"] for e in attention) == st.TINY.attention_max  # attention up to its cap
    assert all(e["error"] is None and e["items"] == st.eval_count(e["seq_len"], st.TINY) for e in ext)
    assert "not run" in (results / "synthetic_induction.md").read_text()
    mqar = json.loads((results / "synthetic_mqar.json").read_text())["runs"]
    assert {(r["seq_len"], r["n_pairs"]) for r in mqar} == set(st.TINY.mqar_cells)
    assert all(r["batch_size"] == 4 and r["d_model"] == 16 for r in mqar)

    # Again, reading only: the same rows from the finished runs, nothing trained.
    before = (results / "synthetic_mqar.json").read_text()
    assert st.main(["report", "--tiny", "--out", str(out), "--results", str(results)]) == 0
    assert (results / "synthetic_mqar.json").read_text() == before


def test_extrapolation_is_reused_however_the_output_directory_is_named(tmp_path, monkeypatch, capsys):
    """A finished extrapolation group written with absolute run paths is not evaluated again when the same
    runs are named relatively (``--out runs/...``), and its rows are read back."""
    st = _module()
    out, results = tmp_path / "runs", tmp_path / "results"
    assert st.main(["induction", "--tiny", "--out", str(out), "--results", str(results)]) == 0
    first = json.loads((results / "synthetic_induction.json").read_text())["extrapolation"]
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)
    assert st.main(["induction", "--tiny", "--out", "runs", "--results", "results"]) == 0
    assert "== extrapolate" not in capsys.readouterr().err
    again = json.loads((results / "synthetic_induction.json").read_text())["extrapolation"]
    assert [(e["model"], e["seq_len"], e["accuracy"]) for e in again] == [(e["model"], e["seq_len"], e["accuracy"])
                                                                          for e in first]
    assert "| — |" not in (results / "synthetic_induction.md").read_text().split("Test accuracy")[1].split("paper:")[0]


def test_the_budget_helpers():
    st = _module()
    assert [st.eval_count(n, st.CPU) for n in (64, 1024, 2048, 2 ** 14, 2 ** 20)] == [256, 256, 128, 16, 16]
    cells = st.copying_cells(st.CPU, "lengths")
    assert cells[-1].model == "attention-rope" and cells[-1].info["seq_len"] == 1024  # the dearest run last
    assert [c.info["seq_len"] for c in cells] == sorted(c.info["seq_len"] for c in cells)
    mqar = st.mqar_cells(st.CPU, [64])
    assert {c.experiment().train_config("train").batch_size * c.info["seq_len"] for c in mqar} == {st.MQAR_TOKENS}
    assert all(c.experiment().model.max_len == c.info["seq_len"] for c in mqar if c.model == "attention")
    s4 = st.copying_cell("simple-s4", 512, st.CPU).experiment()
    assert st.extrapolation_dir(Path("x"), [64, 128]) == Path("x/extrapolation/L64-128")
    assert s4.model.primitive_options["l_max"] == 512 and s4.task.options["seq_len"] == 512


def test_bad_options_are_refused(capsys):
    st = _module()
    with pytest.raises(SystemExit) as err:
        st.main(["mqar", "--widths", "sixty-four"])
    assert err.value.code == 2 and "--widths" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        st.main(["table1", "--jobs", "0"])
    assert "--jobs must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        st.main(["report", "tabel1"])
    assert "tables ['tabel1']" in capsys.readouterr().err
