"""``benchmarks/synthetic_tables.py`` runs end to end at toy sizes (``--tiny``): every grid trains through
the experiment layer's plan and local workers, induction heads are evaluated at other lengths through
``longrange extrapolate``, and the raw results (JSON), the Markdown tables and the plots are written;
a second command reads the same results back without training (no accuracies or timings asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import repo_scripts

from longrange.studies.grid import grid_plan

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "synthetic_tables.py"


def _module():
    return repo_scripts.load(SCRIPT)


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
    assert (results / "synthetic_lengths.png").stat().st_size > 0 and (
        results / "synthetic_induction.png"
    ).stat().st_size > 0
    lengths = json.loads((results / "synthetic_lengths.json").read_text())["runs"]
    assert sorted({r["seq_len"] for r in lengths}) == st.TINY.lengths
    table1 = json.loads((results / "synthetic_table1.json").read_text())["runs"]
    shared = {r["run"] for r in table1} & {r["run"] for r in lengths}
    assert len(shared) == len(st.TINY.length_models)  # the length-24 runs are table1's, trained once
    induction = json.loads((results / "synthetic_induction.json").read_text())
    ext = induction["extrapolation"]
    # every model at every training length and seed, each run evaluated at every length (attention to its cap)
    assert {(r["model"], r["seq_len"], r["seed"]) for r in induction["runs"]} == {
        (m, n, s) for m in st.TINY.induction_models for n in st.TINY.train_lengths for s in st.TINY.induction_seeds
    }
    for r in induction["runs"]:
        tested = sorted(e["seq_len"] for e in ext if e["run"] == r["run"])
        cap = st.TINY.attention_max if r["model"] == "attention-abs" else max(st.TINY.extrapolation)
        assert tested == [n for n in st.TINY.extrapolation if n <= cap], r["run"]
        assert all(e["trained_at"] == r["seq_len"] and e["seed"] == r["seed"] for e in ext if e["run"] == r["run"])
    assert all(e["error"] is None and e["items"] == st.eval_count(e["seq_len"], st.TINY) for e in ext)
    md = (results / "synthetic_induction.md").read_text()
    assert "not run" in md and "Chance: 6.7% (15 possible answers)" in md
    assert "| Mamba-S6 | 8 |" in md and "| MHA-Abs | 16 |" in md  # one row per model and training length
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
    part = ["--models", "mamba-s6"]  # half the grid is enough
    assert st.main(["induction", "--tiny", *part, "--out", str(out), "--results", str(results)]) == 0
    first = json.loads((results / "synthetic_induction.json").read_text())["extrapolation"]
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)
    assert st.main(["induction", "--tiny", *part, "--out", "runs", "--results", "results"]) == 0
    assert "== extrapolate" not in capsys.readouterr().err
    again = json.loads((results / "synthetic_induction.json").read_text())["extrapolation"]
    assert [(e["model"], e["seq_len"], e["accuracy"]) for e in again] == [
        (e["model"], e["seq_len"], e["accuracy"]) for e in first
    ]
    table = (results / "synthetic_induction.md").read_text().split("Test accuracy")[1]
    rows = [line for line in table.splitlines() if line.startswith("| Mamba-S6 |")]
    assert len(rows) == len(st.TINY.train_lengths) and not any("| — |" in line for line in rows)


def test_the_budget_helpers():
    st = _module()
    assert [st.eval_count(n, st.CPU) for n in (64, 1024, 2048, 2**14, 2**20)] == [256, 256, 128, 16, 16]
    cells = st.copying_cells(st.CPU, "lengths")
    assert cells[-1].model == "attention-rope" and cells[-1].info["seq_len"] == 1024  # the dearest run last
    assert [c.info["seq_len"] for c in cells] == sorted(c.info["seq_len"] for c in cells)
    mqar = st.mqar_cells(st.CPU, [64])
    assert {c.experiment().train_config("train").batch_size * c.info["seq_len"] for c in mqar} == {st.MQAR_TOKENS}
    assert all(c.experiment().model.max_len == c.info["seq_len"] for c in mqar if c.model == "attention")
    s4 = st.copying_cell("simple-s4", 512, st.CPU).experiment()
    assert st.extrapolation_dir(Path("x"), [64, 128]) == Path("x/extrapolation/L64-128")
    assert st.extrapolation_dir(Path("x"), [64], 2) == Path("x/extrapolation/L64-part2")
    induction = st.induction_cells(st.CPU)  # every model x lengths 64, 128 x seeds 0, 1, the shorter length first
    assert len(induction) == len(st.INDUCTION_MODELS) * 2 * 2 and len(st.INDUCTION_MODELS) == 18
    assert [c.info["seq_len"] for c in induction] == sorted(c.info["seq_len"] for c in induction)
    assert [(c.model, c.seed) for c in induction[:2]] == [("mamba-s6", 0), ("mamba-s6", 1)]
    assert max(st.EXTRAPOLATION_LENGTHS) == 2**16
    for c in induction:
        exp = c.experiment()
        assert exp.task.options["seq_len"] == c.info["seq_len"] and c.label.endswith(f"L={c.info['seq_len']}")
        if c.model == "hyena":  # the filter spans the longest test length
            assert exp.model.primitive_options["l_max"] == 2**16
        if c.model.endswith("-s4"):  # the kernel at the training length
            assert exp.model.primitive_options["l_max"] == c.info["seq_len"]
    plan = grid_plan(induction[:4])  # two experiments (labels), two seeds each
    assert [s.id.split("/", 2)[2] for s in plan.stages] == [f"scratch/seed{s}" for s in (0, 1, 0, 1)]
    assert s4.model.primitive_options["l_max"] == 512 and s4.task.options["seq_len"] == 512


def test_models_reruns_some_rows_and_keeps_the_others_from_an_earlier_run(tmp_path, capsys):
    st = _module()
    first, second, results = tmp_path / "first", tmp_path / "second", tmp_path / "results"
    assert st.main(["table1", "--tiny", "--out", str(first), "--results", str(results)]) == 0
    earlier = {r["model"]: r for r in json.loads((results / "synthetic_table1.json").read_text())["runs"]}
    rerun = st.TINY.table1_models[0]
    # a fresh output folder: only the chosen model trains, the others come from the results file
    assert st.main(["table1", "--tiny", "--models", rerun, "--out", str(second), "--results", str(results)]) == 0
    rows = {r["model"]: r for r in json.loads((results / "synthetic_table1.json").read_text())["runs"]}
    assert not rows[rerun].get("earlier") and rows[rerun]["run"].startswith(str(second))
    others = [m for m in st.TINY.table1_models if m != rerun]
    assert all(rows[m]["earlier"] and rows[m]["run"] == earlier[m]["run"] for m in others)
    assert "Rows marked * were not rerun" in (results / "synthetic_table1.md").read_text()
    # a row whose settings differ is not taken from the results file: other overrides, another
    # fingerprint (the preset changed since: same name, other settings), or none recorded
    kept = json.loads((results / "synthetic_table1.json").read_text())
    for change in ({"overrides": ["other"]}, {"fingerprint": "0" * 16}, {"fingerprint": None}):
        stale = {**kept, "runs": [{**r, **change} for r in kept["runs"]]}
        (results / "synthetic_table1.json").write_text(json.dumps(stale))
        assert st.main(["report", "table1", "--tiny", "--out", str(second), "--results", str(results)]) == 0
        rows = {r["model"]: r for r in json.loads((results / "synthetic_table1.json").read_text())["runs"]}
        assert rows[others[0]]["test_accuracy"] is None and not rows[others[0]].get("earlier"), change
    (results / "synthetic_table1.json").write_text(json.dumps(kept))  # unchanged: kept again
    assert st.main(["report", "table1", "--tiny", "--out", str(second), "--results", str(results)]) == 0
    rows = {r["model"]: r for r in json.loads((results / "synthetic_table1.json").read_text())["runs"]}
    assert rows[others[0]]["earlier"] and rows[others[0]]["fingerprint"] == kept["runs"][1]["fingerprint"]
    with pytest.raises(SystemExit):
        st.main(["table1", "--tiny", "--models", "mamba-s7"])
    assert "--models: mamba-s7 not in table1's models" in capsys.readouterr().err


def test_the_induction_grid_runs_in_parts(tmp_path, capsys):
    """--models trains only the models named; a later part evaluates only the runs it adds, into a
    folder of its own, and the table holds both parts."""
    st = _module()
    out, results = tmp_path / "runs", tmp_path / "results"
    assert st.main(["induction", "--tiny", "--models", "mamba-s6", "--out", str(out), "--results", str(results)]) == 0
    runs = json.loads((results / "synthetic_induction.json").read_text())["runs"]
    assert {r["model"] for r in runs if r["state"] == "finished"} == {"mamba-s6"}
    assert all(r["state"] == "pending" or r["model"] == "mamba-s6" for r in runs)
    first = {p.name for p in (out / "induction-heads" / "extrapolation").iterdir()}
    capsys.readouterr()
    assert (
        st.main(["induction", "--tiny", "--models", "attention-abs", "--out", str(out), "--results", str(results)]) == 0
    )
    err = capsys.readouterr().err
    assert "== extrapolate" in err and f"{2 * 2} runs" in err and f"{4 * 2} runs" not in err  # the new runs only
    second = {p.name for p in (out / "induction-heads" / "extrapolation").iterdir()} - first
    assert "L8-16-part2" in second  # beside the first part's L8-16, which is kept
    data = json.loads((results / "synthetic_induction.json").read_text())
    assert all(r["state"] == "finished" for r in data["runs"])
    assert {e["model"] for e in data["extrapolation"]} == {"mamba-s6", "attention-abs"}
    with pytest.raises(SystemExit):
        st.main(["induction", "--tiny", "--models", "h3-s4"])
    assert "--models: h3-s4 not in induction's models" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        st.main(["lengths", "--tiny", "--models", "mamba-s6"])
    assert "--models: only with table1, induction, mqar or all" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        st.main(["mqar", "--tiny", "--models", "mamba-s7"])
    assert "--models: mamba-s7 not in mqar's models" in capsys.readouterr().err


def test_mqar_adds_a_model_of_its_presets_and_builds_long_filters_for_each_length(tmp_path, capsys):
    """--models adds any zoology/mqar/cpu preset to the MQAR table beside the scale's models (kept
    from the results file); a BaseConv stack's implicit filter is built for each cell's length."""
    st = _module()
    out, results = tmp_path / "runs", tmp_path / "results"
    assert st.main(["mqar", "--tiny", "--out", str(out), "--results", str(results)]) == 0
    assert (
        st.main(["mqar", "--tiny", "--models", "base-conv", "--out", str(tmp_path / "more"), "--results", str(results)])
        == 0
    )
    rows = json.loads((results / "synthetic_mqar.json").read_text())["runs"]
    assert {r["model"] for r in rows} == {*st.TINY.mqar_models, "base-conv"}
    assert all(r["state"] == "finished" for r in rows)
    assert all(bool(r.get("earlier")) == (r["model"] != "base-conv") for r in rows)
    assert "Cells marked * were not rerun" in (results / "synthetic_mqar.md").read_text()
    for cell in st.mqar_cells(st.TINY, [16], ["base-conv"]):
        if cell.model == "base-conv":
            assert cell.experiment().model.layers[1]["options"]["l_max"] == cell.info["seq_len"]


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
