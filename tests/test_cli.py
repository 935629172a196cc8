"""The command line: overrides anywhere, --data-dir/--skip-bad on every command that loads data,
'did you mean' for presets and fields, --out that is a file, all through ``longrange.cli.main``."""

from __future__ import annotations

import pytest

from longrange.cli import build_parser, main
from longrange.errors import ConfigError
from longrange.experiment.cli import data_settings


def _one_error_line(capsys, command: str) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"longrange {command}: error: "), err
    return err


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--preset", "p", "train.lr=3e-4", "--out", "o", "model.d_model=64", "--seed", "2"],
        ["train", "model.d_model=64", "--preset", "p", "train.lr=3e-4", "--out", "o", "--seed", "2"],
        ["train", "--preset", "p", "--out", "o", "--seed", "2", "model.d_model=64", "train.lr=3e-4"],
    ],
)
def test_overrides_anywhere_on_the_command_line(argv):
    args = build_parser().parse_args(argv)
    assert sorted(args.settings) == ["model.d_model=64", "train.lr=3e-4"]
    assert (args.preset, args.out, args.seed) == ("p", "o", 2)


def test_compare_and_report_positionals_anywhere():
    args = build_parser().parse_args(["compare", "--preset", "a", "x.y=1", "--preset", "b", "--out", "o", "z=2"])
    assert args.preset == ["a", "b"] and args.settings == ["x.y=1", "z=2"] and args.out == "o"
    args = build_parser().parse_args(["report", "--no-plots", "r1", "--out", "o", "r2"])
    assert args.runs == ["r1", "r2"] and args.out == "o" and args.no_plots
    args = build_parser().parse_args(["data", "info", "--data-dir", "d", "listops", "-o", "seq_len=8"])
    assert (args.task, args.data_dir, args.options) == ("listops", "d", ["seq_len=8"])


@pytest.mark.parametrize("command", [["train"], ["pretrain"], ["finetune", "--from", "f"], ["compare"], ["params"]])
def test_data_dir_and_skip_bad_on_every_command_that_loads_data(command):
    argv = command + ["--data-dir", "/data/x 1", "--skip-bad"] + (["--out", "o"] if command[0] != "params" else [])
    args = build_parser().parse_args(argv)
    assert data_settings(args, getattr(args, "settings", [])) == ['task.data_dir="/data/x 1"', "task.skip_bad=true"]


def test_data_dir_reaches_the_task(tmp_path, capsys):
    # listops data missing under the given dir: the error names that dir, so the flag was applied
    data = tmp_path / "mydata"
    assert main(["train", "--preset", "spt/listops/s4", "--out", str(tmp_path / "run"), "--data-dir", str(data)]) == 1
    assert str(data / "listops" / "basic_train.tsv") in _one_error_line(capsys, "train")
    # params counts ListOps without its data (a fixed vocabulary); Text's vocabulary needs the data
    assert main(["params", "--preset", "spt/text/s4", "--data-dir", str(data)]) == 1
    assert str(data / "text") in _one_error_line(capsys, "params")


def test_data_dir_given_twice_is_an_error(tmp_path, capsys):
    args = build_parser().parse_args(["train", "--out", "o", "--data-dir", "a", "task.data_dir=b"])
    with pytest.raises(ConfigError, match="--data-dir and task.data_dir"):
        data_settings(args, args.settings)
    assert (
        main(["train", "--preset", "spt/listops/s4", "--out", str(tmp_path / "r"), "--skip-bad", "task.skip_bad=false"])
        == 1
    )
    assert "--skip-bad and task.skip_bad" in _one_error_line(capsys, "train")


def test_misspelled_preset_and_field_suggest(tmp_path, capsys):
    assert main(["train", "--preset", "spt/listop/s4", "--out", str(tmp_path / "r")]) == 1
    assert "did you mean spt/listops/s4" in _one_error_line(capsys, "train")
    assert main(["compare", "--preset", "spt/listops/s5", "--out", str(tmp_path / "c")]) == 1
    assert "did you mean spt/listops/s4" in _one_error_line(capsys, "compare")
    assert main(["train", "--preset", "spt/listops/s4", "--out", str(tmp_path / "r"), "model.d_modle=8"]) == 1
    assert "model.d_modle (did you mean d_model?)" in _one_error_line(capsys, "train")


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--preset", "spt/listops/s4", "--out", "{file}"],
        ["compare", "--preset", "spt/listops/s4", "--out", "{file}"],
        ["report", "{runs}", "--out", "{file}"],
        ["report", "{runs}", "--out", "{file}/sub"],
        ["data", "generate", "listops", "--out", "{file}", "--n-train", "4", "--n-val", "2", "--n-test", "2"],
    ],
)
def test_out_that_is_a_file_is_one_line_config_error(tmp_path, capsys, argv):
    file = tmp_path / "a-file"
    file.write_text("keep me")
    (tmp_path / "runs").mkdir()
    argv = [a.format(file=file, runs=tmp_path / "runs") for a in argv]
    assert main(argv) == 1
    command = argv[0]
    err = _one_error_line(capsys, command)
    assert "is not a directory" in err and "--out" in err and str(file) in err
    assert file.read_text() == "keep me"


def test_the_command_table_is_what_the_modules_register():
    """``longrange --help`` reads COMMANDS instead of importing every command module: the table must
    name each command of each module, with the module's own help line, in COMMAND_MODULES' order."""
    import argparse
    import importlib

    from longrange.cli import COMMAND_MODULES, COMMANDS, CommandParser

    registered = {}
    for module in COMMAND_MODULES:
        sub = CommandParser(prog="x").add_subparsers()
        importlib.import_module(module).register(sub)
        for action in sub._choices_actions:
            registered[action.dest] = (module, action.help)
    assert COMMANDS == registered
    assert list(COMMANDS) == list(registered)
    assert isinstance(sub, argparse._SubParsersAction)


def test_help_imports_no_command_module_and_a_command_only_its_own():
    import subprocess
    import sys

    code = (
        "import sys, contextlib, io\n"
        "from longrange.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try: main(sys.argv[1:])\n"
        "    except SystemExit: pass\n"
        "print(sorted(m for m in sys.modules if m.startswith(('torch', 'longrange.experiment', 'longrange.bench'))))"
    )
    out = subprocess.run([sys.executable, "-c", code, "--help"], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    out = subprocess.run([sys.executable, "-c", code, "presets"], capture_output=True, text=True, check=True).stdout
    assert "longrange.experiment.cli" in out and "longrange.bench.cli" not in out


def test_an_unknown_command_suggests_the_closest(capsys):
    from longrange.cli import main

    assert main(["comapre"]) == 2
    assert "unknown command 'comapre' (did you mean 'compare'?)" in capsys.readouterr().err
