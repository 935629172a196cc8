"""Dry runs (``experiment/dryrun.py``): every preset's stages take one training step on the meta device
at the preset's published batch size and length, and a bug a GPU run would meet fails the dry run.

The parametrised test runs every preset (supervised training, and pretraining with each objective
the preset compares), about 190 steps. Nothing is computed, but PyTorch computes the meta device's
shapes in Python, about 0.1-0.2 ms per operation, and a step of a 6-layer model is several thousand
operations (forward, backward, AdamW): the whole takes about 30 s of CPU time here. The S4 presets
at length 16384 and 65536 (Path-X) are the slowest (0.3-0.6 s each): an S4 layer's kernel
computation and bidirectional FFT convolution are many small operations.
"""

from __future__ import annotations

import pytest
import torch
from test_presets import PYTHIA_70M, pythia_dir, vocab_for  # noqa: F401  (pythia_dir is a fixture)

import longrange.data  # noqa: F401  (registers the tasks)
from longrange.data.tasks import get_spec
from longrange.errors import ConfigError
from longrange.experiment.config import list_presets, resolve
from longrange.experiment.dryrun import META, DryRunError, dry_run, dry_stages, prepare_step, synthetic_batch
from longrange.objectives.supervised import PositionClassification
from longrange.ops import used

#: The kernel a GPU runs for each SSM primitive; on meta the dispatcher traces it (its fake implementation).
GPU_KERNELS = {
    "s6": {"selective_scan": "triton"},
    "s4": {"cauchy": "triton"},
    "s4d": {"vandermonde": "triton"},
    "dlr": {"vandermonde": "triton"},
}


def experiment(name: str, pythia=None):
    """The preset; block hf presets read Pythia-70M's configuration from a local directory (no download)."""
    exp = resolve(name)
    overrides = []
    if exp.model.block == "hf":
        overrides += [f"model.hf.model={pythia}", "model.hf.pretrained=false"]
    if exp.train.get("precision", "fp32") != "fp32":  # the meta device has no autocast: the step in fp32
        overrides.append("train.precision=fp32")
    return resolve(name, overrides=overrides) if overrides else exp


def token_vocab(exp) -> int | None:
    """The vocabulary of text and retrieval (their data is not here); None for the others (fixed)."""
    return vocab_for(exp.task.name) if exp.task.name in ("text", "retrieval") else None


@pytest.mark.parametrize("name", list_presets())
def test_every_preset_takes_a_training_step_on_meta(name, pythia_dir):  # noqa: F811 (the fixture)
    exp = experiment(name, pythia_dir)
    spec = get_spec(exp.task.name, **exp.task.options)
    stages = dry_stages(exp)
    assert stages[0] == ("train", "supervised")
    for stage, objective in stages:
        run = dry_run(exp, stage, objective, name=name, vocab=token_vocab(exp))
        train = exp.train_config(stage)
        assert (run.device, run.batch_size, run.seq_len) == ("meta", train.batch_size, spec.seq_len)
        assert run.micro_batch == train.batch_size // train.grad_accum
        dtype = "int64" if spec.input_kind == "tokens" else "float32"
        assert run.inputs.startswith(f"{dtype} ({run.micro_batch}, {spec.seq_len}"), run.inputs
        assert run.parameters > 0
        signed = exp.model.primitive_options.get("allow_neg_eigval", False)  # S6's own scan, no kernel
        if exp.model.primitive in GPU_KERNELS and exp.model.block != "hf" and not exp.model.layers and not signed:
            assert GPU_KERNELS[exp.model.primitive].items() <= run.kernels.items(), run.kernels
        if signed:
            assert "selective_scan" not in run.kernels, run.kernels
        assert name in run.describe()


def test_pretraining_stages_follow_the_preset():
    exp = resolve("spt/path-x/s4")
    assert dry_stages(exp) == [("train", "supervised"), ("pretrain", "masked")]
    assert dry_stages(
        resolve("demo/s4d", overrides=["compare.objectives=[causal,masked]", "model.direction=causal"])
    ) == [("train", "supervised"), ("pretrain", "causal"), ("pretrain", "masked")]
    thesis = resolve("thesis/scifar/mamba-s6")
    assert not thesis.pretrain and dry_stages(thesis) == [("train", "supervised")]
    assert prepare_step(exp, "pretrain", device=META).stage.objective == "masked"  # the default: the compared one


@pytest.mark.parametrize("task", ["mqar", "selective-copying", "induction-heads"])
def test_per_position_tasks_take_their_objective_on_meta(task):
    exp = resolve(
        "demo/s4d",
        overrides=[
            f"task.name={task}",
            "task.generate=null",
            "model.direction=causal",
            "task.options={n_train: 32, n_val: 8, n_test: 8}",
            "train.batch_size=8",
        ],
    )
    for stage, objective in (("train", None), ("pretrain", "causal"), ("pretrain", "masked")):
        run = dry_run(exp, stage, objective, name=task)
        assert run.objective == (objective or "supervised")
    prepared = prepare_step(exp, device=META)
    assert isinstance(prepared.objective, PositionClassification)
    targets = prepared.batches[0]["targets"]
    assert targets.shape == (8, get_spec(task, n_train=32, n_val=8, n_test=8).seq_len) and targets.dtype == torch.int64


def test_synthetic_batches_have_the_tasks_kinds():
    image = get_spec("image-numeric")
    batch = synthetic_batch(image, 3, 16, vocab_size=None, device="cpu")
    assert batch["inputs"].shape == (3, 16, 1) and batch["inputs"].dtype == torch.float32
    assert batch["lengths"].tolist() == [16, 16, 16] and batch["targets"].shape == (3,)
    retrieval = synthetic_batch(get_spec("retrieval"), 2, 8, vocab_size=40, device="cpu")
    assert retrieval["inputs"].dtype == retrieval["inputs2"].dtype == torch.int64
    assert 5 <= int(retrieval["inputs"].min()) and int(retrieval["inputs"].max()) < 40  # task tokens, no specials
    bidmc = synthetic_batch(get_spec("bidmc-hr"), 2, 8, vocab_size=None, device="cpu")
    assert bidmc["inputs"].shape == (2, 8, 2) and bidmc["targets"].dtype == torch.float32
    with pytest.raises(ConfigError, match="needs the vocabulary size"):
        synthetic_batch(get_spec("listops"), 2, 8, vocab_size=None, device="cpu")


# ------------------------------------------------------------------------------------------------
# Bugs a GPU run would meet fail the dry run
# ------------------------------------------------------------------------------------------------
def _plant(monkeypatch, bug):
    """Replace S4D's forward (demo/s4d's primitive) by the original followed by ``bug(y)``."""
    from longrange.layers.s4d import S4D

    original = S4D.forward

    def forward(self, x, *args, **kwargs):
        return bug(original(self, x, *args, **kwargs))

    monkeypatch.setattr(S4D, "forward", forward)


def test_a_tensor_made_without_its_device_fails_the_dry_run_naming_the_preset(monkeypatch):
    _plant(monkeypatch, lambda y: y + torch.zeros(y.shape[-1]))  # the bug: no device=y.device
    # On the CPU the bug is invisible: every tensor is on the CPU anyway.
    cpu = prepare_step(resolve("demo/s4d"), device="cpu", batch_size=2, seq_len=16)
    assert torch.isfinite(cpu.step())
    with pytest.raises(
        DryRunError,
        match=r"dry run of demo/s4d \(train, objective supervised\) at batch 32 .* x "
        r"length 128 on meta failed: .*(device|meta).*",
    ) as caught:
        dry_run(resolve("demo/s4d"), name="demo/s4d")
    assert "cpu" in str(caught.value.__cause__)


def test_a_cpu_scalar_mixes_with_meta_tensors_as_with_cuda_ones(monkeypatch):
    _plant(monkeypatch, lambda y: y * torch.tensor(2.0))  # 0-dimensional CPU tensors are allowed with CUDA ones
    assert dry_run(resolve("demo/s4d")).device == "meta"


def test_a_dtype_error_fails_the_dry_run(monkeypatch):
    _plant(monkeypatch, lambda y: y.double())  # float64 activations meet float32 weights
    with pytest.raises(DryRunError, match="demo/s4d .*dtype"):
        dry_run(resolve("demo/s4d"), name="demo/s4d")


def test_a_shape_error_at_the_published_length_fails_the_dry_run():
    exp = resolve("spt/listops/transformer", overrides=["model.pos_embedding=learned", "model.max_len=1024"])
    with pytest.raises(DryRunError, match=r"listops-learned .* x length 2048 .*exceeds the learned position table"):
        dry_run(exp, name="listops-learned")
    assert dry_run(exp, seq_len=1024).seq_len == 1024  # the same model at a length its table holds


def test_autocast_on_meta_is_refused_clearly():
    with pytest.raises(ConfigError, match="train.precision 'bf16': the meta device has no autocast"):
        dry_run(resolve("demo/s4d", overrides=["train.precision=bf16"]))


# ------------------------------------------------------------------------------------------------
# What the dry run needed of the ops and models
# ------------------------------------------------------------------------------------------------
def test_the_scan_dispatcher_traces_the_gpu_kernel_on_meta():
    from longrange.ops.scan import auto_impl, available_impls, selective_scan

    assert auto_impl("meta") == "triton" and "triton" in available_impls("meta")
    b, d, n, length = 2, 8, 4, 64
    u = torch.randn(b, d, length, device=META, requires_grad=True)
    delta, A = torch.rand(b, d, length, device=META), -torch.rand(d, n, device=META)
    B, C = torch.randn(b, n, length, device=META), torch.randn(b, n, length, device=META)
    used.reset()
    out = selective_scan(u, delta, A, B, C)
    out.sum().backward()
    assert used.kernels() == {"selective_scan": "triton"}
    assert out.shape == (b, d, length) and out.device == META and u.grad.shape == u.shape


def test_ops_work_in_one_piece_on_meta():
    """The pieces bound real temporaries; the meta device has none: one FFT per operand. (The
    kernel's spectrum is taken once for every piece.)"""
    from torch.utils._python_dispatch import TorchDispatchMode

    from longrange.ops.fftconv import fft_conv

    class Count(TorchDispatchMode):
        ffts = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.ffts += func is torch.ops.aten._fft_r2c.default
            return func(*args, **(kwargs or {}))

    for device, pieces in (("cpu", 8), (META, 1)):
        u, k = torch.randn(4, 8, 256, device=device), torch.randn(8, 256, device=device)
        Count.ffts = 0
        with Count():
            fft_conv(u, k, chunk_bytes=4 * 257 * 8)  # the CPU's pieces: one channel each
        assert Count.ffts == pieces + 1


def test_value_checks_are_skipped_only_without_data():
    from longrange.models.encoders import TokenEncoder
    from longrange.ops.attention.masked import _is_left_aligned

    encoder = TokenEncoder(10, 4)
    with pytest.raises(ValueError, match="token id 12 is outside the vocabulary of size 10"):
        encoder(torch.tensor([[1, 12]]))
    with torch.device(META):
        assert TokenEncoder(10, 4)(torch.tensor([[1, 12]], device=META)).shape == (1, 2, 4)
    assert not _is_left_aligned(torch.tensor([[True, False, True]]))
    assert _is_left_aligned(torch.ones(2, 3, dtype=torch.bool, device=META))  # every mask from lengths is


def test_a_hugging_face_model_built_on_meta_describes_itself(pythia_dir):  # noqa: F811 (the fixture)
    """``rebuild_info`` read the token map back from its buffers, which a model built on the meta
    device does not hold: it keeps the map it was given."""
    from longrange.models import build_model

    cfg = resolve("spt/listops/pythia", overrides=[f"model.hf.model={pythia_dir}", "model.hf.pretrained=false"]).model
    kwargs = dict(input_kind="tokens", head="classify", n_out=10, vocab_size=20)
    real = build_model(cfg, **kwargs).rebuild_info()
    with torch.device(META):
        meta = build_model(cfg, **kwargs).rebuild_info()
    assert meta == real and real["token_map"] == [[i] for i in range(20)]
