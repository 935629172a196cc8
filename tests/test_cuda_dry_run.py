"""tests/test_cuda.py run on the CPU (``LONGRANGE_TEST_CUDA_DRY_RUN=1``) as part of every test run.

The CUDA module is skipped without a GPU, so a fault that its checks would find on a CPU too (bf16
autocast through every model family, a short training run per family) went unseen until a GPU ran
it: S4D's short convolution under bf16 autocast failed so in its backward. Its dry run takes a few
seconds; it runs in a subprocess, so that the module's device and environment stay its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_cuda_modules_checks_pass_on_the_cpu(tmp_path):
    env = {**os.environ, "LONGRANGE_TEST_CUDA_DRY_RUN": "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "--tb=short", "tests/test_cuda.py"]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert " passed" in out.stdout and "failed" not in out.stdout
