"""A new user's study, end to end, from the documentation's words: a plugin package that registers a
primitive through a ``longrange-plugins`` entry point, one ``longrange compare`` of it against S4D
and the Transformer at the demo's setting, then ``longrange predict`` on new inputs with one of the
resulting runs, each command a process of its own, as a user types them.

The plugin is the primitive of docs/extending.md (its code block), made known as the page says an
installed package is: an entry point of the group ``longrange-plugins``. Installing it would change
this environment, so the test writes what installing writes, a ``*.dist-info`` folder with
``entry_points.txt``, beside the package in a temporary folder on the commands' ``PYTHONPATH``:
``importlib.metadata`` finds entry points on ``sys.path`` just so, and nothing outside the folder
changes. No ``LONGRANGE_PLUGINS`` is set, so the later ``predict`` finds the plugin (which its run's
model needs) by the entry point alone. The compare is the README's study command at the smallest
budget its words allow: one seed, one label count, a tiny width and a few steps (overrides in a
``--config`` file, as the study's ``tiny.yaml``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXTENDING = ROOT / "docs" / "extending.md"
INFERENCE = ROOT / "docs" / "inference.md"

#: The user's own experiment: the demo's setting with the plugin's primitive (as the study's longconv.yaml).
MY_MODEL = """\
label: Moving average
base: demo/recall/_base
model: {block: simple, primitive: moving-average, primitive_options: {width: 4}}
"""
#: Tiny sizes on top of each model (as the study's tiny.yaml): one seed, one label count, a few steps.
TINY = """\
task:
  options: {n_train: 64, n_val: 16, n_test: 16}
model: {d_model: 16, n_layers: 1}
train: {max_steps: 4, eval_every: 4, log_every: 2, batch_size: 8}
pretrain: {max_steps: 4, eval_every: 4}
compare: {seeds: [0], train_subsets: [32]}
"""


def page_block(page: Path, first_line: str) -> str:
    """The code block of ``page`` that starts with ``first_line``."""
    for block in re.findall(r"```[a-z]*\n(.*?)```", page.read_text(), re.S):
        block = textwrap.dedent(block)  # a block inside a list item is indented
        if block.startswith(first_line):
            return block
    raise AssertionError(f"{page.name} has no code block starting with {first_line!r}")


def entry_point_of_the_page() -> tuple[str, str, str]:
    """(group, name, module) of the entry point docs/extending.md declares in a pyproject.toml."""
    block = page_block(EXTENDING, "[project.entry-points.")
    group = re.match(r'\[project\.entry-points\."([^"]+)"\]', block).group(1)
    name, module = re.search(r'^\s*(\S+)\s*=\s*"([^"]+)"', block, re.M).groups()
    return group, name, module


def longrange(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "longrange", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"longrange {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def test_a_plugin_compared_and_then_predicting_on_new_inputs(tmp_path):
    # 1. the plugin package, "installed" by its entry point (what pip writes into site-packages)
    site = tmp_path / "site"
    group, name, module = entry_point_of_the_page()
    assert group == "longrange-plugins" and module == "mymodels.moving_average"
    package = site / "mymodels"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "moving_average.py").write_text(page_block(EXTENDING, "# mymodels/moving_average.py"))
    dist = site / "mymodels_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mymodels-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{group}]\n{name} = {module}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("LONGRANGE_PLUGINS", "LONGRANGE_SMOKE")}
    env["PYTHONPATH"] = os.pathsep.join([str(site)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["LONGRANGE_DATA"] = str(tmp_path / "data")

    # 2. one comparison: the plugin against S4D and the Transformer, matched in parameters
    (tmp_path / "my_model.yaml").write_text(MY_MODEL)
    (tmp_path / "tiny.yaml").write_text(TINY)
    done = longrange(
        [
            "compare",
            "--preset",
            "demo/recall/transformer",
            "--preset",
            "demo/recall/s4d",
            "--preset",
            "my_model.yaml",
            "--config",
            "tiny.yaml",
            "--match-params",
            "--out",
            "runs/study",
        ],
        tmp_path,
        env,
    )
    for row in ("Moving average", "Moving average + causal SPT (all inputs)", "S4D", "Transformer"):
        assert f"| {row} |" in done.stdout
    assert "matched to Transformer: Moving average: model.d_model 16 -> " in done.stdout + done.stderr
    out = tmp_path / "runs" / "study"
    assert (out / "report.md").is_file()
    run = out / "associative-recall" / "Moving-average" / "subset32" / "causal-spt-all" / "seed0" / "finetune"
    assert (run / "summary.json").is_file()

    # 3. predictions on new inputs: the documented associative-recall line (the demo's setting) and one more
    documented = json.loads(page_block(INFERENCE, '{"id": "r1"'))
    other = {"id": "r2", "tokens": [5, 16, 9, 27, 11, 19, 13, 22] + [0] * 15 + [9], "answers": [27]}
    (tmp_path / "new.jsonl").write_text(json.dumps(documented) + "\n" + json.dumps(other) + "\n")
    done = longrange(
        [
            "predict",
            str(run.relative_to(tmp_path)),
            "--input",
            "new.jsonl",
            "--output",
            "predictions.tsv",
            "--device",
            "cpu",
        ],
        tmp_path,
        env,
    )
    lines = (tmp_path / "predictions.tsv").read_text().splitlines()
    assert lines[0] == "id\tprediction\ttarget"
    rows = [line.split("\t") for line in lines[1:]]
    assert [r[0] for r in rows] == ["r1", "r2"] and [r[2] for r in rows] == ["30", "27"]
    assert all(16 <= int(r[1]) <= 31 for r in rows)  # a value of the task's vocabulary (16 keys, 16 values)
    assert "2 predictions of runs/study/associative-recall/Moving-average" in done.stderr
    assert re.search(r"\d of 2 labelled inputs right", done.stderr)
