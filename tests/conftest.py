"""Test options shared by the whole suite.

``--device {cpu,cuda,all}`` selects the devices of the device-parametrised tests (those taking the
``device`` fixture) and whether the CUDA module ``tests/test_cuda.py`` runs: ``all`` (the default)
means every available device, so a machine with a GPU runs the CPU and the CUDA tests and a
machine without one the CPU tests only; ``cpu`` leaves the GPU alone; ``cuda`` runs on the GPU only
(and skips, saying why, where there is none).
"""

from __future__ import annotations

import os

import pytest
import torch

DEVICE_CHOICES = ("cpu", "cuda", "all")


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``-n auto``: one test process per core) each process computes on its share
    of the cores, so that the processes do not oversubscribe the machine (PyTorch's default is every
    core in every process)."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(workers)))


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


@pytest.fixture
def inductor_cpu() -> None:
    """For tests that compile CPU code with Inductor (``torch.compile``'s default backend): skips, with
    the reason, where its C++ build cannot run because a path it passes to the compiler and linker
    unquoted holds whitespace (a checkout or virtual environment in a folder whose name has a space:
    "ld: cannot find ..."); see ``longrange.train.compile.cpp_build_blocker``."""
    from longrange.train.compile import cpp_build_blocker

    reason = cpp_build_blocker()
    if reason is not None:
        pytest.skip(f"torch.compile cannot build CPU code here: {reason}")


@pytest.fixture(scope="session")
def cuda_device(request: pytest.FixtureRequest) -> torch.device:
    """The CUDA device for tests that need one; skips when CUDA is absent or not selected."""
    if request.config.getoption("device") == "cpu":
        pytest.skip("CUDA tests not selected (--device cpu)")
    if not torch.cuda.is_available():
        pytest.skip("CUDA is not available")
    return torch.device("cuda")


# ---------------------------------------------------------------------------------------------------
# Weights & Biases in offline mode
# ---------------------------------------------------------------------------------------------------
class OfflineWandb:
    """The runs W&B wrote in offline mode under ``root`` (``WANDB_DIR``), read from its files."""

    def __init__(self, root):
        self.root = root

    def runs(self) -> list[dict]:
        """One dict per offline run directory, oldest first: ``id``, ``name``, ``group``,
        ``project``, ``config`` (top-level keys, values decoded), ``history`` (one dict per logged
        step) and ``summary`` (the summary's last values)."""
        import wandb

        wandb.teardown()  # W&B's service writes the files in the background: stop it, so that they are complete
        return [self._read(path) for path in sorted(self.root.glob("wandb/offline-run-*/run-*.wandb"))]

    @staticmethod
    def _records(path):
        """The protobuf records of a W&B transaction log (a LevelDB-style log: a 7-byte file
        header, then 32 KiB blocks of chunks, each with a 7-byte header: crc, length, type)."""
        import struct

        from wandb.proto import wandb_internal_pb2 as pb

        data = path.read_bytes()
        assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
        pos, block, pending = 7, 32768, b""
        while pos + 7 <= len(data):
            left = block - pos % block
            if left < 7:  # the rest of a block is padding
                pos += left
                continue
            _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
            if kind == 0 and length == 0:
                pos += left
                continue
            pending += data[pos + 7 : pos + 7 + length]
            pos += 7 + length
            if kind in (1, 4):  # a whole record, or the last chunk of one
                record = pb.Record()
                record.ParseFromString(pending)
                pending = b""
                yield record

    def _read(self, path) -> dict:
        import json

        out = {"dir": path.parent, "config": {}, "history": [], "summary": {}}

        def key(item):
            return item.key or "/".join(item.nested_key)

        for record in self._records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run = record.run
                out.update(id=run.run_id, name=run.display_name, group=run.run_group, project=run.project)
                out["config"].update({key(i): json.loads(i.value_json) for i in run.config.update})
            elif kind == "config":
                out["config"].update({key(i): json.loads(i.value_json) for i in record.config.update})
            elif kind == "history":
                out["history"].append({key(i): json.loads(i.value_json) for i in record.history.item})
            elif kind == "summary":
                out["summary"].update({key(i): json.loads(i.value_json) for i in record.summary.update})
        return out


@pytest.fixture
def float64_default():
    """float64 as torch's default dtype during the test (modes compared at float64 precision);
    the previous default is restored afterwards. A module uses it for all its tests with
    ``pytestmark = pytest.mark.usefixtures("float64_default")``."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


@pytest.fixture
def wandb_offline(tmp_path_factory, monkeypatch) -> OfflineWandb:
    """W&B in offline mode writing into a temporary ``WANDB_DIR`` (no network, no account);
    skips where wandb is not installed."""
    pytest.importorskip("wandb")
    root = tmp_path_factory.mktemp("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(root))
    monkeypatch.setenv("WANDB_SILENT", "true")
    import wandb

    wandb.teardown()  # W&B reads its environment once per process setup: start a fresh one
    yield OfflineWandb(root)
    wandb.teardown()


@pytest.fixture
def compile_for_cuda(tmp_path, monkeypatch):
    """Compiles a Triton kernel to a CUDA binary for sm_90 with Triton's bundled CUDA toolchain, no GPU
    needed (the interpreter accepts code that the compiler may not); skips where this Triton has no
    CUDA backend. Call it as ``compile_for_cuda(jit, constants, pointer_dtype, num_warps)``: the
    arguments named in ``constants`` are constexpr, those ending in ``_ptr`` point to
    ``pointer_dtype(name)`` ("fp32", "bf16", ...), the others are i32; ``options=`` adds compile
    options of the launch (``enable_fp_fusion``, ...); it returns the cubin."""
    triton = pytest.importorskip("triton")
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource

        assert "nvidia" in triton.backends.backends
    except (ImportError, AttributeError, AssertionError):
        pytest.skip("this Triton has no CUDA backend to compile with")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")

    def compile_(jit, constants: dict, pointer_dtype, num_warps: int, options: dict | None = None):
        signature = {
            name: "constexpr" if name in constants else (f"*{pointer_dtype(name)}" if name.endswith("_ptr") else "i32")
            for name in jit.arg_names
        }
        kernel = triton.compile(
            ASTSource(jit, signature, constexprs=constants),
            target=GPUTarget("cuda", 90, 32),
            options={"num_warps": num_warps, **(options or {})},
        )
        return kernel.asm["cubin"]

    return compile_
