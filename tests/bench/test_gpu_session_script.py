"""``benchmarks/gpu_session.py``: the GPU session's one command, tried on a CPU before a GPU runs it.

A step that fails or runs out of time is recorded with its reason and the others still run; steps
left out are recorded as not run; a later part updates its own steps in the same summary. The whole
session at tiny sizes on the CPU (``--device cpu --tiny``) runs every step, each ending ok or
recorded as failed with its reason (``-m slow``: it takes minutes on a loaded 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest
import repo_scripts
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_session.py"


@pytest.fixture(scope="module")
def session():
    yield repo_scripts.load(SCRIPT)
    sys.modules.pop("gpu_session", None)


def _args(out, **kw):
    base = dict(
        out=str(out),
        device="cpu",
        tiny=True,
        only=None,
        gpu=None,
        pytest_args=None,
        timeout_scale=1.0,
        budget=None,
        train_steps=300,
        pathx_batch=1,
        step=None,
        kernel_ops=None,
    )
    return argparse.Namespace(**{**base, **kw})


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_failing_or_slow_step_is_recorded_and_the_others_run(session, tmp_path, monkeypatch):
    monkeypatch.setattr(session, "MIN_STEP_SECONDS", 1)
    steps = [
        session.Step("first", "prints", [_py("print('first ran')")], timeout=60),
        session.Step(
            "boom",
            "fails",
            [_py("print('about to fail'); raise SystemExit(3)"), _py("print('second command ran')")],
            timeout=60,
        ),
        session.Step(
            "slow",
            "sleeps past its timeout",
            [_py("import time; print('sleeping', flush=True); time.sleep(60)")],
            timeout=2,
        ),
        session.Step(
            "last",
            "writes a result",
            [_py(f"open({str(tmp_path / 'results' / 'last.json')!r}, 'w').write('{{}}')")],
            timeout=60,
        ),
    ]
    summary = session.run_session(_args(tmp_path), steps)
    by = {s["name"]: s for s in summary["steps"]}
    assert [s["name"] for s in summary["steps"]] == ["first", "boom", "slow", "last"]
    assert by["first"]["status"] == "ok" and by["last"]["status"] == "ok"
    assert by["last"]["results"] == ["results/last.json"]
    assert by["boom"]["status"] == "failed" and [c["returncode"] for c in by["boom"]["commands"]] == [3, 0]
    assert "1 of 2 command(s) failed" in by["boom"]["reason"] and "about to fail" in by["boom"]["reason"]
    assert "second command ran" in (tmp_path / by["boom"]["log"]).read_text()  # the step's next command still ran
    assert by["slow"]["status"] == "timeout" and by["slow"]["commands"][0]["timed_out"]
    assert "sleeping" in by["slow"]["reason"] and by["slow"]["seconds"] < 30
    saved = json.loads((tmp_path / "session.json").read_text())
    assert saved["steps"] == summary["steps"] and saved["environment"]["torch"] == torch.__version__
    assert saved["environment"]["command"] and saved["settings"]["device"] == "cpu"
    md = (tmp_path / "session.md").read_text()
    assert "| boom | failed |" in md and "| slow | timeout |" in md and "### boom: failed" in md

    # A later part: the steps it runs are replaced, the others kept as they were.
    again = session.run_session(
        _args(tmp_path, only="first"), [steps[0], session.Step("boom", "now fine", [_py("")], 60)]
    )
    by = {s["name"]: s for s in again["steps"]}
    assert by["first"]["status"] == "ok" and by["boom"]["status"] == "failed"  # boom not selected: its record stays
    fresh = session.run_session(_args(tmp_path / "other", only="first"), steps[:2])
    assert {s["name"]: s["status"] for s in fresh["steps"]} == {"first": "ok", "boom": "not run"}
    assert "not selected (--only first)" in fresh["steps"][1]["reason"]
    with pytest.raises(SystemExit, match="unknown step.*nope.*the steps are first, boom"):
        session.run_session(_args(tmp_path, only="nope"), steps[:2])

    # A budget for the whole run (a command limited to 10 minutes): no step outlives it, the rest are not run.
    slow = session.Step("slow", "sleeps", steps[2].commands, timeout=60)
    budget = session.run_session(_args(tmp_path / "budget", budget=3), [slow, steps[3]])
    by = {s["name"]: s for s in budget["steps"]}
    assert by["slow"]["status"] == "timeout" and by["slow"]["timeout_s"] <= 3  # cut to what was left of the budget
    assert by["last"]["status"] == "not run" and "--budget of 3 s was spent" in by["last"]["reason"]


def test_the_steps_of_a_gpu_session_and_of_the_tiny_cpu_run(session, tmp_path, monkeypatch):
    monkeypatch.delenv("TRITON_CACHE_AUTOTUNING", raising=False)
    gpu = {s.name: s for s in session.build_steps(_args(tmp_path, device="cuda", tiny=False))}
    # autotuning results kept on disk: the next process's probe does not autotune again
    assert gpu["external"].env == {"TRITON_CACHE_AUTOTUNING": "1"}
    monkeypatch.setenv("TRITON_CACHE_AUTOTUNING", "0")  # a user's own setting stands
    assert session.build_steps(_args(tmp_path, device="cuda"))[session.STEPS.index("external")].env == {
        "TRITON_CACHE_AUTOTUNING": "0"
    }
    assert list(gpu) == list(session.STEPS)
    assert gpu["tests"].commands[0][-2:] == ["--device", "cuda"]
    assert {"-v", "-rfE"} <= set(gpu["tests"].commands[0])  # each test named as it ends: a cut step says which failed
    assert gpu["check"].commands[0][-3:] == ["check", "--device", "cuda"]
    assert [c[c.index("--length") + 1] + c[c.index("--dtype") + 1] for c in gpu["scan"].commands] == [
        "1024fp32",
        "1024bf16",
        "4096fp32",
        "4096bf16",
        "16384fp32",
        "16384bf16",
    ]
    assert all(c[c.index("--batch") + 1] == "64" and c[c.index("--d") + 1] == "232" for c in gpu["scan"].commands)
    assert "--full" in gpu["bench"].commands[0] and "TRITON_INTERPRET" not in gpu["kernels"].env
    tiny = {s.name: s for s in session.build_steps(_args(tmp_path))}
    assert tiny["kernels"].env == {"TRITON_INTERPRET": "1"} and "--tiny" in tiny["train"].commands[0]
    halved = {s.name: s for s in session.build_steps(_args(tmp_path, timeout_scale=0.5))}
    assert halved["tests"].timeout == session.TIMEOUTS["tests"] / 2
    # The most needed first: the checks, then the timings, the training steps, the test suite, the
    # CPU's placements last.
    order = list(session.STEPS)
    assert order[:3] == ["info", "check", "kernels"] and order.index("families") < order.index("tests")
    assert order[-1] == "placement"
    sixteen = session._placement_command(tmp_path, tiny=False, cores=16)
    assert sixteen[sixteen.index("--placements") + 1] == "16x1,8x2,4x4" and "--no-sequential" in sixteen
    assert sixteen[sixteen.index("--max-steps") + 1] == "100" and sixteen[-1] == str(tmp_path / "placement.json")
    assert "--warmup" in sixteen  # the first placement is not charged for generating the data
    two = session._placement_command(tmp_path, tiny=True, cores=2)
    assert two[two.index("--placements") + 1] == "2x1" and two[two.index("--max-steps") + 1] == "2"


@pytest.mark.slow
def test_the_whole_session_runs_on_a_cpu_at_tiny_sizes(session, tmp_path):
    summary = session.run_session(_args(tmp_path / "s"))
    out = tmp_path / "s"
    by = {s["name"]: s for s in summary["steps"]}
    assert list(by) == list(session.STEPS)
    for name, step in by.items():
        assert step["status"] in ("ok", "failed", "timeout"), name
        assert (out / step["log"]).exists(), name
        assert step["status"] == "ok" or step["reason"], name
    if not torch.cuda.is_available():  # the GPU scan benchmark refuses a machine without CUDA, saying so
        assert by["scan"]["status"] == "failed" and "no CUDA device" in by["scan"]["reason"]
    for name in (
        "info",
        "tests",
        "check",
        "kernels",
        "ssm_kernels",
        "families",
        "planner",
        "bench",
        "train",
        "pathx",
        "external",
        "placement",
    ):
        assert by[name]["status"] == "ok", (name, by[name].get("reason"))
    results = {Path(r).name for s in summary["steps"] for r in s["results"]}
    assert {
        "info.json",
        "kernels.json",
        "ssm_kernels.json",
        "planner.json",
        "bench.json",
        "train.json",
        "pathx.json",
        "external.json",
        "placement.json",
    } <= results
    kernels = json.loads((out / "results" / "kernels.json").read_text())
    assert kernels["failures"] == 0 and {r["length"] for r in kernels["rows"]} == {1, 7, 64}
    assert any("bitwise_repeatable" in r for r in kernels["rows"])
    planner = json.loads((out / "results" / "planner.json").read_text())
    assert all("measured" in r and r["plan"]["peak_bytes"]["total"] > 0 for r in planner["rows"])
    train = json.loads((out / "results" / "train.json").read_text())
    assert {(r["preset"], r["precision"]) for r in train["rows"]} == {
        (p, q) for p in session.TRAIN_PRESETS for q in ("bf16", "fp32")
    }
    assert all(r["steps"] == 4 and r["tokens_per_s"] > 0 and r["loss_judged"] is False for r in train["rows"])
    assert "| planner | ok |" in (out / "session.md").read_text()
    families = json.loads((out / "results" / "families.json").read_text())
    assert {(r["family"], r["precision"]) for r in families["rows"]} == {
        (f, q) for f, _, _ in session.FAMILY_PRESETS for q in ("fp32", "bf16")
    }
    assert all(r["loss_finite"] and r["tokens_per_s"] > 0 and r["kernels"] is not None for r in families["rows"])


def test_a_training_run_is_judged_by_its_falling_loss_only_past_its_warmup(session):
    flat = {"steps": 100, "loss_first": 2.28, "loss_last": 2.30, "loss_falls": False}
    assert not session._judge_loss(row := dict(flat), 1000, tiny=False)  # inside the warmup: not judged
    assert row["warmup"] == 1000 and row["loss_judged"] is False
    assert session._judge_loss(row := dict(flat), 50, tiny=False) and row["loss_judged"] is True
    assert not session._judge_loss(dict(flat), 50, tiny=True)  # a tiny run is too short
    assert not session._judge_loss({**flat, "loss_last": 2.0, "loss_falls": True}, 50, tiny=False)
    for bad in (float("nan"), float("inf")):  # never finite: a failure, judged or not
        assert session._judge_loss({**flat, "loss_last": bad}, 1000, tiny=True)


def test_the_external_step_records_each_maintained_kernel_and_why_it_is_not_used_off_cuda(session, tmp_path, capsys):
    from longrange.ops.matrix_state import external

    args = argparse.Namespace(out=str(tmp_path), device="cpu", tiny=True)
    assert session.step_external(args) == 0
    probes = json.loads((tmp_path / "results" / "external.json").read_text())["probes"]
    assert [p["op"] for p in probes] == list(external.SOURCES)
    assert all(not p["usable"] and "runs on CUDA tensors only" in p["reason"] for p in probes)
    assert "nothing to check" in capsys.readouterr().out


def test_the_scans_byte_bound_counts_each_input_once_each_way(tmp_path):
    """gpu_scan.py's bound: the forward reads every input once and writes the output; forward +
    backward adds a read of every input and the output's gradient and a write of every gradient."""
    gpu_scan = repo_scripts.load(SCRIPT.parent / "gpu_scan.py")
    b, d, n, length = 2, 3, 4, 5
    inputs = gpu_scan.make_inputs(b, d, n, length, torch.bfloat16, torch.device("cpu"))
    big = 3 * b * d * length * 2 + 2 * b * n * length * 2  # u, delta, z; B, C in bf16
    small = (d * n + 2 * d) * 4  # A, D, delta_bias in float32
    assert gpu_scan.scan_bytes(inputs, "forward") == big + small + b * d * length * 2
    assert gpu_scan.scan_bytes(inputs, "train") == 2 * (big + small + b * d * length * 2) + big + small


def test_a_step_out_of_time_stops_its_subprocesses_too(session, tmp_path):
    """The timeout stops the step's whole process group: a subprocess the step started (as the info
    step starts ``longrange info``) does not run on into the next steps."""
    marker = tmp_path / "late"
    child = f"import time, pathlib; time.sleep(3); pathlib.Path({str(marker)!r}).write_text('still running')"
    parent = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(60)"
    step = session.Step("spawns", "starts a subprocess and outlives its timeout", [_py(parent)], timeout=1.5)
    record = session.run_step(step, tmp_path)
    assert record["status"] == "timeout"
    import time

    time.sleep(4)
    assert not marker.exists()


def test_pack_holds_every_finished_step_without_the_generated_data(session, tmp_path, monkeypatch):
    """``--pack``: one archive of the session's folder after every step (a lent GPU returns only a few
    files of its output folder), without ``data/`` (the generated sets)."""
    import tarfile

    monkeypatch.setattr(session, "MIN_STEP_SECONDS", 1)
    out = tmp_path / "s"
    writes = [
        "import pathlib",
        f"p = pathlib.Path({str(out)!r})",
        "(p / 'data' / 'generated').mkdir(parents=True, exist_ok=True)",
        "(p / 'data' / 'generated' / 'big.tsv').write_text('x')",
        "(p / 'results' / 'first.json').write_text('{}')",
        "(p / 'results' / 'train' / 'run' / 'checkpoints').mkdir(parents=True)",
        "(p / 'results' / 'train' / 'run' / 'checkpoints' / 'last.pt').write_text('x')",
        "(p / 'results' / 'train' / 'run' / 'summary.json').write_text('{}')",
    ]
    steps = [
        session.Step("first", "writes", [_py("; ".join(writes))], timeout=60),
        session.Step("boom", "fails", [_py("raise SystemExit(3)")], timeout=60),
    ]
    pack = tmp_path / "back" / "s.tgz"
    session.run_session(_args(out, pack=str(pack)), steps)
    with tarfile.open(pack) as tar:
        names = set(tar.getnames())
        saved = json.loads(tar.extractfile("s/session.json").read())
    assert {"s/session.json", "s/session.md", "s/logs/first.log", "s/logs/boom.log", "s/results/first.json"} <= names
    assert not any(n.startswith("s/data") or "checkpoints" in n for n in names), names
    assert "s/results/train/run/summary.json" in names
    assert [s["status"] for s in saved["steps"]] == ["ok", "failed"]
    assert not list(pack.parent.glob("*.tmp"))


def test_sigterm_stops_the_running_step_and_its_subprocesses_and_says_so(tmp_path):
    """An outer ``timeout`` ends the session with SIGTERM: the running step's process group goes too
    (a probe once ran on into the machine's next call), the summary says the step was stopped, and
    the pack is written."""
    import signal
    import subprocess
    import tarfile
    import time

    marker, out, pack = tmp_path / "late", tmp_path / "s", tmp_path / "s.tgz"
    child = f"import time, pathlib; time.sleep(2); pathlib.Path({str(marker)!r}).write_text('still running')"
    parent = (
        f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); "
        "print('spawned', flush=True); time.sleep(60)"
    )
    driver = f"""
import argparse, importlib.util, sys
spec = importlib.util.spec_from_file_location("gpu_session", {str(SCRIPT)!r})
m = importlib.util.module_from_spec(spec); sys.modules["gpu_session"] = m; spec.loader.exec_module(m)
m._stop_on_sigterm()
args = argparse.Namespace(out={str(out)!r}, device="cpu", tiny=True, only=None, timeout_scale=1.0, budget=None,
                          pack={str(pack)!r})
steps = [m.Step("first", "fine", [[sys.executable, "-c", "print('first ran')"]], 60),
         m.Step("spawns", "starts a subprocess", [[sys.executable, "-c", {parent!r}]], 60)]
m.run_session(args, steps)
"""
    proc = subprocess.Popen([sys.executable, "-c", driver])
    log = out / "logs" / "spawns.log"
    deadline = time.time() + 60
    while not (log.exists() and "spawned" in log.read_text()):  # the step has started its child
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.1)
    spawned = time.time()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    time.sleep(max(0.0, spawned + 3 - time.time()))  # past the moment the child would have written
    assert not marker.exists()  # the step's grandchild was stopped with it
    by = {s["name"]: s for s in json.loads((out / "session.json").read_text())["steps"]}
    assert by["first"]["status"] == "ok" and by["spawns"]["status"] == "stopped"
    assert "SIGTERM" in by["spawns"]["reason"]
    with tarfile.open(pack) as tar:
        assert "s/logs/spawns.log" in tar.getnames()


def test_tiny_overrides_build_every_long_filter_for_the_tiny_length(session):
    from longrange.experiment.config import resolve

    s4 = resolve("spt/listops/s4", overrides=session._tiny_overrides("spt/listops/s4"))
    assert s4.model.primitive_options["l_max"] == 64
    # a stack whose second entry is a long convolution: its l_max is in the layer's own options
    stack = session._tiny_overrides("demo/recall/base-conv")
    model = resolve("demo/recall/base-conv", overrides=[*stack, "model.n_layers=2"]).model.to_dict()
    assert [entry["options"].get("l_max") for entry in model["layers"]] == [None, 64]
    assert not any("l_max" in o for o in session._tiny_overrides("spt/listops/transformer"))
