"""The published MAD scores of Hyena + SwiGLU and MH Hyena + SwiGLU, read off MAD's Figure 1.

Usage:
    python benchmarks/mad_published_scores.py PATH/TO/mad-lab/assets/mad_to_scale.png

MAD (Poli et al. 2024, arXiv 2403.17844) gives its scores in figures, not as numbers. Its Figure 1
(athms/mad-lab, ``assets/mad_to_scale.png``, 3300 x 1155 pixels) plots, per task, each
architecture's MAD score (the x axis, "Eval. Acc.") against its compute-optimal perplexity, and on
the left their mean over the six tasks. This script reads the scores of the two architectures the
figure marks with a circle (Hyena + SwiGLU, MAD's ``hyena`` stack) and a square (MH Hyena +
SwiGLU): the blue markers' bounding boxes (the circle 35 pixels across, filling about 79% of
its box; the square filling it) against the axis ticks, which point inwards from each panel's
lower frame line. A tick at a frame line is taken from the frame (fuzzy recall's 0.0 and 0.3,
selective copying's 0.90, compression's 0.4, memorization's 0.90, the mean's 0.80). One pixel is
1/1540 to 1/30800 of a unit, by panel. Check: the mean of the six task scores is printed beside
the left panel's reading (they agree to 0.001). ``longrange.studies.mad.PUBLISHED_SCORES`` holds the
result.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from PIL import Image
from scipy import ndimage

MARKER_RGB = (108, 125, 168)
#: panel -> (left frame x, right frame x, upper frame y, lower frame y, the values of its ticks from
#: left to right, those on a frame line included: :data:`AT_FRAME`).
PANELS = {
    "mad-in-context-recall": (1463, 1923, 123, 456, [0.8, 0.9, 1.0]),
    "mad-fuzzy-recall": (2101, 2561, 123, 456, [0.0, 0.1, 0.2, 0.3]),
    "mad-noisy-recall": (2739, 3200, 123, 456, [0.8, 0.9, 1.0]),
    "mad-selective-copying": (1463, 1923, 641, 974, [0.90, 0.95, 1.00]),
    "mad-compression": (2101, 2561, 641, 974, [0.4, 0.5]),
    "mad-memorization": (2739, 3200, 641, 974, [0.89, 0.90]),
    "mean": (186, 1285, 123, 974, [0.65, 0.70, 0.75, 0.80]),
}
#: Where a tick sits on a frame line: panel -> (values at the left frame, values at the right frame).
AT_FRAME = {
    "mad-fuzzy-recall": ([0.0], [0.3]),
    "mad-selective-copying": ([0.90], []),
    "mad-compression": ([0.4], []),
    "mad-memorization": ([], [0.90]),
    "mean": ([], [0.80]),
}


def ticks(black: np.ndarray, x0: int, x1: int, y: int) -> list[float]:
    """The x of each inward tick above the lower frame line at ``y`` between the frames."""
    band = black[y - 14 : y - 2, x0 + 3 : x1 - 2]
    columns = np.where(band.sum(0) >= 8)[0] + x0 + 3
    groups: list[list[int]] = []
    for c in columns:
        if groups and c - groups[-1][-1] <= 1:
            groups[-1].append(int(c))
        else:
            groups.append([int(c)])
    return [float(np.mean(g)) for g in groups]


def markers(rgb: np.ndarray) -> list[tuple[str, float, float]]:
    """(shape, x, y) of each circle and square marker: its bounding box's centre."""
    mask = np.abs(rgb - np.array(MARKER_RGB)).sum(-1) < 30
    labels, _ = ndimage.label(mask)
    out = []
    for i, box in enumerate(ndimage.find_objects(labels)):
        h, w = box[0].stop - box[0].start, box[1].stop - box[1].start
        if not (33 <= w <= 37 and 33 <= h <= 37):
            continue  # the triangles, stars and diamonds are wider
        fill = (labels[box] == i + 1).sum() / (w * h)
        shape = "square" if fill > 0.88 else "circle" if fill > 0.6 else None
        if shape:
            out.append((shape, (box[1].start + box[1].stop - 1) / 2, (box[0].start + box[0].stop - 1) / 2))
    return out


def read(path: str) -> dict[str, dict[str, float]]:
    """shape -> panel -> the value read off the figure."""
    rgb = np.array(Image.open(path).convert("RGB")).astype(int)
    if rgb.shape[:2] != (1155, 3300):
        raise ValueError(f"{path}: expected MAD's Figure 1 at 3300 x 1155 pixels, got {rgb.shape[1]} x {rgb.shape[0]}")
    black = rgb.sum(-1) < 100
    found = markers(rgb)
    result: dict[str, dict[str, float]] = {"circle": {}, "square": {}}
    for panel, (x0, x1, top, y, values) in PANELS.items():
        left, right = AT_FRAME.get(panel, ([], []))
        xs = [x0 - 0.5] * len(left) + ticks(black, x0, x1, y) + [x1 + 0.5] * len(right)
        if len(xs) != len(values):
            raise ValueError(f"{path}: panel {panel}: found {len(xs)} ticks, expected {len(values)}")
        slope = np.polyfit(xs, values, 1)
        for shape, x, my in found:
            if x0 < x < x1 and top < my < y:
                result[shape][panel] = float(np.polyval(slope, x))
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("figure", help="athms/mad-lab's assets/mad_to_scale.png")
    args = p.parse_args(argv)
    names = {"circle": "Hyena + SwiGLU", "square": "MH Hyena + SwiGLU"}
    for shape, scores in read(args.figure).items():
        tasks = {k: v for k, v in scores.items() if k != "mean"}
        print(f"{names[shape]}: " + ", ".join(f"{k} {v:.3f}" for k, v in tasks.items()))
        print(
            f"  mean of the {len(tasks)} tasks {np.mean(list(tasks.values())):.4f}; left panel {scores.get('mean', float('nan')):.4f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
