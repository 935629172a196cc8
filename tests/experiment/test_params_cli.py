"""``longrange params``: the thesis' Table 3 parameter counts (a command module of the experiment layer)."""

from __future__ import annotations

from longrange.cli import COMMAND_MODULES, main


def test_params_prints_the_table3_counts(capsys):
    assert "longrange.experiment.params_cli" in COMMAND_MODULES
    assert main(["params"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "| model | total | in primitives | % in primitives |"
    assert out[2:] == [
        "| Mamba-S6 | 585.7k | 91.9k | 16% |",
        "| Mamba-S4D | 563.4k | 69.6k | 12% |",
        "| Mamba-S4 | 585.7k | 91.9k | 16% |",
        "| Simple-S4D | 551.1k | 197.9k | 36% |",
        "| Simple-S4 | 616.4k | 263.2k | 43% |",
    ]


# ---------------------------------------------------------------------- presets, configs, overrides, --match
def _total(preset: str, *overrides: str) -> int:
    from longrange.experiment.config import resolve
    from longrange.experiment.params import model_size

    return int(model_size(resolve(preset, overrides=list(overrides)))["total"])


def _rows(out: str) -> dict[str, list[str]]:
    return {
        cells[1].strip(): [c.strip() for c in cells[2:-1]]
        for cells in (line.split("|") for line in out.splitlines()[2:])
    }


def test_params_takes_presets_configs_and_overrides_like_compare(tmp_path, capsys):
    assert main(["params", "--preset", "demo/s4d", "model.d_model=128"]) == 0
    assert _rows(capsys.readouterr().out)["demo/s4d"][0] == f"{_total('demo/s4d', 'model.d_model=128') / 1000:.1f}k"
    wide = tmp_path / "wide.yaml"
    wide.write_text("label: wide\nmodel: {d_model: 96}\n")
    own = tmp_path / "own.yaml"
    own.write_text("base: demo/dlr\nlabel: mine\nmodel: {n_layers: 3}\n")
    assert (
        main(["params", "--preset", "demo/s4d", "--preset", str(own), "--config", str(wide), "model.d_state=8,16"]) == 0
    )
    rows = _rows(capsys.readouterr().out)
    assert list(rows) == [
        f"demo/s4d + {wide} (d_state=8)",
        f"demo/s4d + {wide} (d_state=16)",
        f"{own} + {wide} (d_state=8)",
        f"{own} + {wide} (d_state=16)",
    ]
    assert rows[f"{own} + {wide} (d_state=16)"][-1] == "simple-dlr bidirectional L=3 d=96 N=16"
    assert (
        rows[f"demo/s4d + {wide} (d_state=8)"][0]
        == f"{_total('demo/s4d', 'model.d_model=96', 'model.d_state=8') / 1000:.1f}k"
    )
    assert main(["params", "model.d_model=3"]) == 1
    assert "give the models to count with --preset" in capsys.readouterr().err


def test_match_finds_the_width_closest_to_another_presets_count(capsys):
    target = _total("demo/transformer")
    assert (
        main(
            [
                "params",
                "--match",
                "demo/transformer",
                "--vary",
                "model.d_model",
                "--preset",
                "demo/s4d",
                "--preset",
                "demo/dlr",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"target: demo/transformer, {target:,} parameters"
    rows = _rows("\n".join(out.splitlines()[1:]))
    for preset in ("demo/s4d", "demo/dlr"):  # the search agrees with trying every width
        best = min(range(96, 160), key=lambda d: (abs(_total(preset, f"model.d_model={d}") - target), d))
        assert rows[preset][0] == f"64 -> {best}" and rows[preset][-1] == f"`model.d_model={best}`"
        assert abs(_total(preset, f"model.d_model={best}") / target - 1) < 0.01


def test_match_steps_over_widths_a_model_cannot_take():
    """A Transformer's width must divide by its heads: only multiples of 4 are candidates."""
    from longrange.experiment.config import resolve
    from longrange.experiment.params import match_field

    target = _total("demo/s4d")
    found = match_field(resolve("demo/transformer"), target)
    assert found.value % 4 == 0
    best = min(range(4, 100, 4), key=lambda d: (abs(_total("demo/transformer", f"model.d_model={d}") - target), d))
    assert found.value == best and found.total == _total("demo/transformer", f"model.d_model={best}")
    assert match_field(resolve("demo/s4d"), 5).value == 1  # smaller than any model: the smallest width
    import pytest

    from longrange.errors import ConfigError

    with pytest.raises(ConfigError, match=r"--vary model.primitive: an integer field is needed"):
        match_field(resolve("demo/s4d"), target, "model.primitive")


def test_a_setting_of_the_other_input_kind_is_an_error():
    """d_input on token inputs was silently ignored, then 'a token encoder needs a vocabulary size, got 0'."""
    import pytest

    from longrange.errors import ConfigError
    from longrange.models import ModelConfig, build_model

    cfg = ModelConfig(block="simple", primitive="s4d", d_model=8)
    with pytest.raises(
        ConfigError, match=r"d_input=20 is the channel count of numeric inputs; token inputs .* vocab_size"
    ):
        build_model(cfg, input_kind="tokens", d_input=20, head="classify", n_out=10)
    with pytest.raises(ConfigError, match=r"token inputs \(input_kind='tokens'\) need vocab_size, .* got None"):
        build_model(cfg, input_kind="tokens", head="classify", n_out=10)
    with pytest.raises(ConfigError, match=r"vocab_size=20 is for token inputs; numeric inputs .* take d_input"):
        build_model(cfg, input_kind="numeric", vocab_size=20, head="classify", n_out=10)
    tokens = build_model(cfg, input_kind="tokens", vocab_size=20, head="classify", n_out=10)
    numeric = build_model(cfg, input_kind="numeric", d_input=20, head="classify", n_out=10)
    assert tokens.encoder.embedding.num_embeddings == 20 and numeric.encoder.linear.in_features == 20
