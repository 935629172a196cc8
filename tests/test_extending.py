"""docs/extending.md, end to end: its primitive and task modules, registered through
``LONGRANGE_PLUGINS``, checked, and trained from Python and from the command line.

The code is taken from the page's code blocks (each starts with a comment naming its file), so
the page cannot drift from what works.
"""

from __future__ import annotations

import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest
import torch

from longrange import registry as registry_module
from longrange.errors import ConfigError

PAGE = Path(__file__).resolve().parents[1] / "docs" / "extending.md"
MODULES = ("mymodels.moving_average", "mymodels.recent_sum")


def page_files() -> dict[str, str]:
    """{file name: content} of the page's code blocks that start with ``# <file>``."""
    files = {}
    for block in re.findall(r"```(?:python|yaml)\n(.*?)```", PAGE.read_text(), re.S):
        first = block.splitlines()[0]
        if re.fullmatch(r"# [\w/.-]+\.(py|yaml)", first):
            files[first[2:]] = block
    return files


def page_commands() -> list[list[str]]:
    """The ``longrange ...`` commands of the page's bash block that sets LONGRANGE_PLUGINS."""
    for block in re.findall(r"```bash\n(.*?)```", PAGE.read_text(), re.S):
        if "LONGRANGE_PLUGINS" in block:
            return [
                shlex.split(line, comments=True)[1:] for line in block.splitlines() if line.startswith("longrange ")
            ]
    raise AssertionError("docs/extending.md has no bash block setting LONGRANGE_PLUGINS")


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    """The page's files written under tmp_path (the working directory), importable, named in
    LONGRANGE_PLUGINS; registrations and modules are removed afterwards."""
    from longrange.data.tasks import TASKS
    from longrange.layers import PRIMITIVES

    files = page_files()
    assert set(files) >= {
        "mymodels/moving_average.py",
        "mymodels/recent_sum.py",
        "train_moving_average.py",
        "my_experiment.yaml",
        "my_hybrid.yaml",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "mymodels" / "__init__.py").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(registry_module.PLUGINS_ENV, ",".join(MODULES))
    monkeypatch.setattr(registry_module, "_plugins_loaded", set())
    yield tmp_path
    PRIMITIVES.unregister("moving-average")
    TASKS.unregister("recent-sum")
    for name in (*MODULES, "mymodels"):
        sys.modules.pop(name, None)


def test_plugins_register_at_the_first_lookup(plugin_dir):
    from longrange.data import TASKS
    from longrange.layers import PRIMITIVES

    assert "mymodels.moving_average" not in sys.modules
    assert "moving-average" in PRIMITIVES and "recent-sum" in TASKS
    assert all(m in sys.modules for m in MODULES)


def test_the_primitive_steps_as_it_runs_and_its_options_are_checked(plugin_dir):
    from longrange.models import ModelConfig, build_model, make_primitive

    torch.manual_seed(0)
    layer = make_primitive("moving-average", 6, d_state=64, width=3).double()
    with torch.no_grad():
        layer.gain.normal_()
    x = torch.randn(2, 9, 6, dtype=torch.float64)
    y = layer(x)
    state, steps = layer.default_state(2), []
    for t in range(9):
        y_t, state = layer.step(x[:, t], state)
        steps.append(y_t)
    torch.testing.assert_close(torch.stack(steps, 1), y)
    torch.testing.assert_close(y[:, 2], (x[:, :3].mean(1)) * layer.gain)
    # padding is zeroed before mixing: outputs at real positions ignore what follows
    mask = torch.arange(9) < torch.tensor([[9], [5]])
    torch.testing.assert_close(layer(x, mask)[1, :5], layer(x[1:, :5])[0])

    with pytest.raises(
        ConfigError,
        match=r"unknown option 'widht' for primitive 'moving-average' \(did you mean 'width'\?\); valid options: width",
    ):
        make_primitive("moving-average", 6, widht=3)
    with pytest.raises(ConfigError, match="moving-average: width must be a positive integer"):
        make_primitive("moving-average", 6, width=0)
    with pytest.raises(ConfigError, match="primitive 'moving-average' has no bidirectional mode"):
        build_model(
            ModelConfig(block="simple", primitive="moving-average", direction="bidirectional"),
            input_kind="numeric",
            head="classify",
            n_out=2,
        )
    with pytest.raises(ConfigError, match=r"unknown primitive 'moving-averag' \(did you mean 'moving-average'\?\)"):
        make_primitive("moving-averag", 6)
    # in a Mamba block, the block supplies the reverse direction and RoPE
    cfg = ModelConfig(
        block="mamba",
        primitive="moving-average",
        direction="bidirectional",
        rope=True,
        n_layers=1,
        d_model=8,
        primitive_options={"width": 2},
    )
    model = build_model(cfg, input_kind="numeric", head="classify", n_out=2)
    assert [type(m).__name__ for m in model.backbone.mixers()] == ["MovingAverage", "MovingAverage"]
    assert model(torch.randn(2, 5, 1)).shape == (2, 2)


def test_the_task_loads_and_refuses_bad_options(plugin_dir):
    from longrange.data import get_spec, load_task

    data = load_task("recent-sum", window=2, n_train=40)
    assert (len(data.train), len(data.val), len(data.test)) == (40, 10, 10)
    item = data.train[0]
    assert item["inputs"].shape[1] == 1 and 16 <= item["inputs"].shape[0] <= 32
    assert int(item["target"]) == int(item["inputs"][-2:].sum() > 0)
    with pytest.raises(ConfigError, match=r"unknown option 'windw' for task recent-sum \(did you mean 'window'\?\)"):
        get_spec("recent-sum", windw=2)
    with pytest.raises(ConfigError, match="recent-sum option window"):
        get_spec("recent-sum", window=20)


def test_training_from_python_and_from_the_command_line(plugin_dir, capsys):
    runpy.run_path(str(plugin_dir / "train_moving_average.py"), run_name="__main__")
    test_metrics = eval(capsys.readouterr().out.strip().splitlines()[-1])  # the script prints summary["test"]
    assert set(test_metrics) == {"loss", "accuracy"} and 0 <= test_metrics["accuracy"] <= 1
    assert (plugin_dir / "runs" / "ma-python" / "metrics.jsonl").is_file()

    from longrange.cli import main

    commands = page_commands()
    assert commands[0][:3] == ["train", "--config", "my_experiment.yaml"]
    for argv in commands:
        assert main(argv) == 0, argv
    out = Path(commands[0][commands[0].index("--out") + 1])
    assert (out / "summary.json").is_file()


@pytest.mark.slow
def test_the_comparison_runs_on_the_new_primitive_and_task(plugin_dir, capsys):
    from longrange.cli import main

    command = re.search(r"`longrange (compare [^`]*)`", PAGE.read_text()).group(1).split()
    assert main(command) == 0
    out = capsys.readouterr().out
    assert "| Moving average + causal SPT |" in out and "recent-sum" in out


def test_the_hybrid_stack_builds_names_itself_and_counts_each_layer(plugin_dir, capsys):
    from longrange.cli import main
    from longrange.experiment.config import resolve
    from longrange.experiment.params import layer_sizes, model_size

    exp = resolve(str(plugin_dir / "my_hybrid.yaml"))
    assert exp.model.name == "residual[moving-average,swiglu,attention,swiglu]*2"
    rows = layer_sizes(exp)
    assert [r["name"] for r in rows] == ["moving-average", "swiglu", "attention", "swiglu"] * 2
    size = model_size(exp)
    assert size["in_primitives"] == sum(r["in_primitives"] for r in rows)
    assert main(["params", "--config", "my_hybrid.yaml", "--per-layer"]) == 0
    assert "| 0 | moving-average |" in capsys.readouterr().out
    assert main(["train", "--config", "my_hybrid.yaml", "--out", "runs/hybrid"]) == 0
    assert (plugin_dir / "runs" / "hybrid" / "summary.json").is_file()
