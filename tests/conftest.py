"""Test options shared by the whole suite.

``--device {cpu,cuda,all}`` selects the devices of the device-parametrised tests (those taking the
``device`` fixture) and whether the CUDA module ``tests/test_cuda.py`` runs: ``all`` (the default)
means every available device, so a machine with a GPU runs the CPU and the CUDA tests and a
machine without one the CPU tests only; ``cpu`` leaves the GPU alone; ``cuda`` runs on the GPU only
(and skips, saying why, where there is none).
"""
from __future__ import annotations

import pytest
import torch

DEVICE_CHOICES = ("cpu", "cuda", "all")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--device",
        default="all",
        choices=DEVICE_CHOICES,
        help="devices of the device-parametrised tests and of tests/test_cuda.py: cpu, cuda, or all "
        "available devices (default all)",
    )


def selected_devices(config: pytest.Config) -> list[str]:
    """The device types chosen by ``--device`` (``all``: the available ones)."""
    choice = config.getoption("device")
    if choice == "all":
        return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    return [choice]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "device" not in metafunc.fixturenames or hasattr(metafunc.module, "device"):
        return  # not device-parametrised, or a module with a device fixture of its own
    params = []
    for name in selected_devices(metafunc.config):
        marks = []
        if name == "cuda" and not torch.cuda.is_available():
            marks = [pytest.mark.skip(reason="--device cuda, but CUDA is not available")]
        params.append(pytest.param(torch.device(name), marks=marks, id=name))
    metafunc.parametrize("device", params)


@pytest.fixture(scope="session")
def cuda_device(request: pytest.FixtureRequest) -> torch.device:
    """The CUDA device for tests that need one; skips when CUDA is absent or not selected."""
    if request.config.getoption("device") == "cpu":
        pytest.skip("CUDA tests not selected (--device cpu)")
    if not torch.cuda.is_available():
        pytest.skip("CUDA is not available")
    return torch.device("cuda")
