import importlib.util

import pytest
from lra_fixtures import write_listops

import longrange.cli
from longrange.data.cli import parse_task_options
from longrange.errors import ConfigError


@pytest.fixture
def main(monkeypatch):
    # only this command module, so the test does not depend on other subsystems' commands
    monkeypatch.setattr(longrange.cli, "COMMAND_MODULES", ["longrange.data.cli"])
    return longrange.cli.main


def test_data_cli_is_registered():
    assert "longrange.data.cli" in longrange.cli.COMMAND_MODULES


def test_list_shows_every_task_with_its_facts(main, capsys):
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    header, *rows = out.strip().splitlines()
    assert header.split() == ["task", "kind", "length", "classes", "metric", "mask", "ratio"]
    by_name = {row.split()[0]: row.split() for row in rows}
    assert by_name["listops"] == ["listops", "tokens", "2048", "10", "accuracy", "0.1"]
    assert by_name["retrieval"] == ["retrieval", "tokens", "x2", "4000", "2", "accuracy", "0.15"]
    assert by_name["text"][2] == "4096"


def test_info_reports_missing_files_and_how_to_generate(main, capsys, tmp_path):
    assert main(["data", "info", "listops", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "status:      MISSING" in out
    assert f"{tmp_path / 'listops' / 'basic_train.tsv'}: missing" in out
    assert "longrange data generate listops" in out and "mask ratio:  0.1" in out


def test_info_reports_present_files_and_options(main, capsys, tmp_path):
    write_listops(tmp_path / "listops")
    assert main(["data", "info", "listops", "--data-dir", str(tmp_path), "-o", "seq_len=512"]) == 0
    out = capsys.readouterr().out
    assert "status:      present" in out and "length 512" in out and "seq_len=512" in out
    assert f"{tmp_path / 'listops' / 'basic_val.tsv'}: found" in out
    assert "to obtain" not in out


def test_errors_print_one_line(main, capsys, tmp_path):
    assert main(["data", "info", "nope"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("longrange data: error: unknown task 'nope'") and "\n" not in err
    assert main(["data", "info", "listops", "-o", "seqlen=3"]) == 1
    assert (
        "unknown option 'seqlen' for task listops (did you mean 'seq_len'?); valid options: seq_len, truncate"
        in capsys.readouterr().err
    )
    assert main(["data", "prepare", "listops", "--data-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "basic_train.tsv but it does not exist" in err and len(err.strip().splitlines()) == 1


def test_generate_then_prepare_listops(main, capsys, tmp_path):
    out_dir = tmp_path / "data" / "listops"
    args = [
        "data",
        "generate",
        "listops",
        "--out",
        str(out_dir),
        "--n-train",
        "60",
        "--n-val",
        "10",
        "--n-test",
        "10",
        "--min-length",
        "10",
        "--max-length",
        "60",
        "--seed",
        "5",
        "--quiet",
    ]
    assert main(args) == 0
    assert "listops: 80 samples" in capsys.readouterr().out
    assert main(["data", "prepare", "listops", "--data-dir", str(tmp_path / "data")]) == 0
    captured = capsys.readouterr()
    assert "listops: train 60, val 10, test 10, vocabulary 20" in captured.out
    assert "preparing listops (first run)" in captured.err
    assert main(["data", "prepare", "listops", "--data-dir", str(tmp_path / "data")]) == 0
    assert "preparing" not in capsys.readouterr().err


def test_generate_listops_bad_options_are_one_line_errors(main, capsys, tmp_path):
    assert (
        main(["data", "generate", "listops", "--out", str(tmp_path), "--min-length", "10", "--max-length", "11"]) == 1
    )
    assert "min_length + 1 < max_length" in capsys.readouterr().err


@pytest.mark.skipif(
    importlib.util.find_spec("longrange.data.generate.pathfinder") is None,
    reason="the pathfinder generator is not part of this installation",
)
def test_generate_pathfinder_is_wired(main, capsys, tmp_path):
    assert (
        main(
            [
                "data",
                "generate",
                "pathfinder",
                "--out",
                str(tmp_path),
                "--resolution",
                "16",
                "--n-samples",
                "2",
                "--contour-length",
                "4",
                "--seed",
                "1",
                "--quiet",
            ]
        )
        == 0
    )
    assert "pathfinder: written to" in capsys.readouterr().out
    assert len(list(tmp_path.rglob("*.png"))) == 2


def test_bare_data_command_prints_help(main, capsys):
    assert main(["data"]) == 2
    assert "SUBCOMMAND" in capsys.readouterr().out


def test_parse_task_options_types():
    assert parse_task_options("text", ["seq_len=1024", "val_from_train=0.1", "source=hf"]) == {
        "seq_len": 1024,
        "val_from_train": 0.1,
        "source": "hf",
    }
    assert parse_task_options("listops", ["truncate=yes"]) == {"truncate": True}
    with pytest.raises(ConfigError, match="expected an integer, got 'many'"):
        parse_task_options("text", ["seq_len=many"])
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_task_options("text", ["seq_len"])
    with pytest.raises(ConfigError, match="expected a bool"):
        parse_task_options("listops", ["truncate=maybe"])
