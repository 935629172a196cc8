"""``longrange list``: what is registered, with options and defaults; plugins found through
entry points; "did you mean" on unknown names."""

from __future__ import annotations

import io
import sys
import textwrap
from contextlib import redirect_stdout

import pytest

import longrange.registry as registry
from longrange.cli import main as cli_main
from longrange.errors import ConfigError
from longrange.listing import listing
from longrange.models.config import ModelConfig
from longrange.models.registry import PRIMITIVES


def test_the_overview_lists_every_kind_and_the_new_mixers():
    text = listing()
    for kind in ("primitives:", "blocks:", "heads:", "objectives:", "tasks:", "ops:"):
        assert kind in text
    for name in ("mamba2", "gla", "deltanet", "gated-deltanet", "hyena", "h3", "lru", "residual", "associative-recall"):
        assert f"  {name}: " in text
    assert "  (in model.layers, channel mixers as layers of their own: swiglu (swiglu MLP), mlp (gelu MLP))" in text
    assert (
        "  ssd: mamba, numba, chunk, naive (auto on cpu: numba for states of up to 1024 elements per head (dk * dv), "
        "or 2048 for keys of up to 32 features, else chunk)" in text
    )
    import torch

    auto = "cuda: chunk" if torch.cuda.is_available() else "cpu: loop"
    assert f"  complex_diag_scan: chunk, loop, ref (auto on {auto})" in text


def test_a_kind_lists_options_with_defaults_and_one_entry_alone():
    text = listing("primitives")
    assert "      gate_low_rank_dim      16" in text and "      d_state" in text
    one = listing("primitive", "gla")  # the singular is accepted
    assert one.splitlines()[1].startswith("  gla: Gated Linear Attention (Yang et al. 2023")
    assert "s6" not in one
    task = listing("tasks", "mqar")
    assert "      n_pairs" in task


def test_every_default_of_none_says_what_it_means():
    """A built-in primitive's option whose default is None (an implementation left to the process
    default, a chunk chosen by device, a width taken from another option) carries a note, and the
    listing prints it beside the None; a note for an option that is not None by default is stale."""
    missing, stale = [], []
    for name in PRIMITIVES.names():
        cls, options = PRIMITIVES.get(name), PRIMITIVES.options(name, 1)
        notes = getattr(cls, "OPTION_NOTES", {})
        missing += [f"{name}.{k}" for k, v in options.items() if v is None and k not in notes]
        stale += [f"{name}.{k}" for k in notes if k not in options or options[k] is not None]
    assert not missing, f"options defaulting to None without an OPTION_NOTES entry: {missing}"
    assert not stale, f"OPTION_NOTES entries for options that do not default to None: {stale}"
    text = listing("primitive", "mamba3")
    assert "      chunk_size     None  (64 single-input (mimo_rank 1), 64 // mimo_rank multi-input)" in text
    assert '      impl           None  (the op\'s default for the process: "auto"' in text
    assert "      d_state        128\n" in text  # no note beside a default that is not None


def test_unknown_names_suggest_the_closest():
    with pytest.raises(ConfigError, match=r"unknown kind 'primitivs' \(did you mean 'primitives'\?\)"):
        listing("primitivs")
    with pytest.raises(ConfigError, match=r"unknown primitive 'glaa' \(did you mean 'gla'\?\)"):
        listing("primitives", "glaa")
    with pytest.raises(ValueError, match=r"did you mean 'gla'"):
        listing("ops", "glx")
    with pytest.raises(
        ValueError, match=r"no dispatcher for the op 'complex_scan'; did you mean 'complex_diag_scan'\?"
    ):
        listing("ops", "complex_scan")
    with pytest.raises(ConfigError, match=r"model.primitive = 's4dd' .* \(did you mean 's4d' or 's4'\?\)"):
        ModelConfig(primitive="s4dd")


def test_the_command_prints_it():
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli_main(["list", "ops", "delta_rule"]) == 0
    assert out.getvalue().startswith(
        "ops:\n  delta_rule: fla, numba, chunk, naive (auto on cpu: numba for states of up"
    )
    assert "chunk: runs on cpu" in out.getvalue()
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli_main(["list", "ops", "complex_diag_scan"]) == 0
    lines = out.getvalue().splitlines()
    assert lines[1].startswith("  complex_diag_scan: chunk, loop, ref (auto on ")
    assert (
        "      chunk: runs on cpu" in lines[2]
        and "      ref: runs on cpu" in lines[4]
        and "(loop over time)" in lines[4]
    )


def test_an_installed_plugin_is_found_through_its_entry_point(tmp_path, monkeypatch):
    """A package that declares a ``longrange-plugins`` entry point is imported at the first lookup,
    without LONGRANGE_PLUGINS: installed once, found by every command."""
    (tmp_path / "lr_entry_plugin").mkdir()
    (tmp_path / "lr_entry_plugin" / "__init__.py").write_text(
        textwrap.dedent('''
        from longrange.layers import SequencePrimitive, register_primitive

        @register_primitive("entry-point-identity")
        class Identity(SequencePrimitive):
            """Returns its input (a plugin test)."""
            def __init__(self, d_model: int, gain: float = 1.0):
                super().__init__()
                self.d_model, self.gain = d_model, gain

            def forward(self, x, mask=None):
                return x * self.gain
    ''')
    )
    dist = tmp_path / "lr_entry_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: lr-entry-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[longrange-plugins]\nidentity = lr_entry_plugin\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_entry_points_loaded", False)
    try:
        assert "entry-point-identity" in PRIMITIVES
        assert "      gain  1.0" in listing("primitives", "entry-point-identity")
    finally:
        PRIMITIVES.unregister("entry-point-identity")
        sys.modules.pop("lr_entry_plugin", None)


def test_a_broken_entry_point_names_itself_and_its_package(tmp_path, monkeypatch):
    dist = tmp_path / "lr_broken_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: lr-broken-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[longrange-plugins]\nbroken = lr_no_such_module\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_entry_points_loaded", False)
    with pytest.raises(ConfigError, match=r"entry point 'broken' of lr-broken-plugin \(lr_no_such_module\) failed"):
        registry.load_entry_points()
