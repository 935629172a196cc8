"""benchmarks/mad_published_scores.py reads marker positions against axis ticks: on a figure drawn
here in the layout of MAD's Figure 1, with markers at known scores, it reads those scores back, and
it refuses a figure of another size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import repo_scripts
from PIL import Image, ImageDraw

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "mad_published_scores.py"


def _module():
    return repo_scripts.load(SCRIPT)


def _figure(mod, path: Path, truth: dict[str, dict[str, float]]) -> None:
    """Frames, inward ticks and a circle and a square per panel, at the scores of ``truth``."""
    im = Image.new("RGB", (3300, 1155), "white")
    draw = ImageDraw.Draw(im)
    for panel, (x0, x1, top, y, values) in mod.PANELS.items():
        draw.rectangle((x0 - 1, top - 1, x1 + 1, y + 1), outline="black", width=2)
        left, right = mod.AT_FRAME.get(panel, ([], []))
        lo, hi = values[0], values[-1]
        x_lo = x0 - 0.5 if left else x0 + 40
        x_hi = x1 + 0.5 if right else x1 - 40

        def px(v, x_lo=x_lo, x_hi=x_hi, lo=lo, hi=hi):
            return x_lo + (v - lo) / (hi - lo) * (x_hi - x_lo)

        for v in values[len(left) : len(values) - len(right)]:
            x = round(px(v))
            draw.line((x, y - 14, x, y - 2), fill="black", width=1)
        for k, shape in enumerate(("circle", "square")):
            cx, cy = px(truth[shape][panel]), top + 60 + 80 * k
            box = (round(cx) - 17, round(cy) - 17, round(cx) + 17, round(cy) + 17)
            (draw.ellipse if shape == "circle" else draw.rectangle)(box, fill=mod.MARKER_RGB)
    im.save(path)


def test_markers_are_read_back_at_their_scores(tmp_path):
    mod = _module()
    rng = np.random.default_rng(0)
    truth = {
        shape: {p: float(rng.uniform(v[0], v[-1])) for p, (*_, v) in mod.PANELS.items()}
        for shape in ("circle", "square")
    }
    _figure(mod, tmp_path / "figure.png", truth)
    read = mod.read(str(tmp_path / "figure.png"))
    for shape in truth:
        for panel, value in truth[shape].items():
            _, _, _, _, values = mod.PANELS[panel]
            pixel = (values[-1] - values[0]) / 400  # about one pixel of the panel's scale
            assert read[shape][panel] == pytest.approx(value, abs=pixel), (shape, panel)


def test_a_figure_of_another_size_is_refused(tmp_path):
    mod = _module()
    Image.new("RGB", (100, 50), "white").save(tmp_path / "small.png")
    with pytest.raises(ValueError, match=r"small.png: expected MAD's Figure 1 at 3300 x 1155 pixels, got 100 x 50"):
        mod.read(str(tmp_path / "small.png"))
