"""``train.compile``: the model compiled with torch.compile trains as the eager model does.

Every built-in family (Simple, Mamba and Transformer blocks with S4, S4D, S6, DLR and attention)
traces into one graph (``fullgraph=True``, Dynamo alone: fast), and its compiled training step
(Inductor) equals the eager step, loss and every gradient, at tiny shapes; Inductor's compilation
takes seconds per model on a CPU, so one family runs by default and the others under ``-m slow``.
A compiled run checkpoints the eager model's state-dict keys and resumes to the weights of an
uninterrupted compiled run. The tests that build CPU code with Inductor skip, saying why, where a
path it passes to the compiler unquoted holds a space (the ``inductor_cpu`` fixture).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from toy import ToyDataset, ToyObjective, toy_setup

from longrange.data.batch import collate
from longrange.errors import ConfigError
from longrange.identity import fingerprint, identity
from longrange.models.config import ModelConfig
from longrange.models.model import build_model
from longrange.ops import used
from longrange.ops.matmul import mm_onednn, onednn_available
from longrange.train import TrainConfig, Trainer, load_checkpoint
from longrange.train.compile import _route_matmuls, compile_model, compile_options, is_compiled, restore
from longrange.train.rundir import RunMismatchError

#: The built-in families at tiny sizes: (block, primitive, direction and other model settings).
FAMILIES = {
    "simple-s4": dict(block="simple", primitive="s4"),
    "simple-s4d-bi": dict(block="simple", primitive="s4d", direction="bidirectional"),
    "simple-dlr-bi": dict(block="simple", primitive="dlr", direction="bidirectional"),
    "simple-s6": dict(block="simple", primitive="s6"),
    "simple-attention": dict(block="simple", primitive="attention"),
    "mamba-s6": dict(block="mamba", primitive="s6"),
    "mamba-s6-bi-rope": dict(block="mamba", primitive="s6", direction="bidirectional", rope=True),
    "mamba-s4d": dict(block="mamba", primitive="s4d"),
    "mamba-s4": dict(block="mamba", primitive="s4"),
    "mamba-dlr": dict(block="mamba", primitive="dlr"),
    "transformer-causal": dict(block="transformer", primitive="attention"),
    "transformer-bi-rope-window": dict(
        block="transformer", primitive="attention", direction="bidirectional", rope=True, attn_window=4
    ),
    # Matrix-state mixers in chunks shorter than the batch (13 positions: a padded last chunk).
    "residual-mamba2": dict(block="residual", primitive="mamba2", primitive_options={"headdim": 4, "chunk_size": 4}),
    "residual-mamba3": dict(block="residual", primitive="mamba3", primitive_options={"headdim": 4, "chunk_size": 4}),
    "residual-mamba3-mimo": dict(
        block="residual", primitive="mamba3", primitive_options={"headdim": 4, "chunk_size": 2, "mimo_rank": 2}
    ),
    "residual-gla": dict(block="residual", primitive="gla", primitive_options={"chunk_size": 4}),
    "residual-gated-deltanet": dict(block="residual", primitive="gated-deltanet", primitive_options={"chunk_size": 4}),
    "residual-hyena": dict(block="residual", primitive="hyena", primitive_options={"l_max": 13}),
    "residual-h3": dict(block="residual", primitive="h3"),
    "residual-lru": dict(block="residual", primitive="lru"),
    "residual-rwkv": dict(block="residual", primitive="rwkv"),
}
#: The family whose Inductor-compiled step runs by default (the others: -m slow).
FAST = "mamba-s6"
VOCAB = 11


def _model(name: str, seed: int = 0):
    torch.manual_seed(seed)
    cfg = ModelConfig(n_layers=2, d_model=16, d_state=4, n_heads=2, dropout=0.0, **FAMILIES[name])
    return build_model(cfg, input_kind="tokens", head="classify", n_out=3, vocab_size=VOCAB)


def _batch():
    g = torch.Generator().manual_seed(1)
    inputs = torch.randint(4, VOCAB, (3, 13), generator=g)
    lengths = torch.tensor([13, 9, 6])  # padded at the end, as collated batches are
    return inputs, lengths, torch.tensor([0, 2, 1])


def _step(model, call):
    """Loss and gradients of one training step (forward, cross-entropy, backward)."""
    inputs, lengths, targets = _batch()
    model.train()
    loss = F.cross_entropy(call(inputs, lengths), targets)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()  # each model compiles afresh (the recompilation limit counts per code object)
    yield
    torch._dynamo.reset()


# --------------------------------------------------------------------------------------------
# The setting
# --------------------------------------------------------------------------------------------


def test_compile_is_a_train_setting_left_out_of_identities_at_its_default():
    default = {"train": TrainConfig().to_dict()}
    assert TrainConfig().compile is False and "compile" not in identity(default)["train"]
    assert fingerprint(default) == fingerprint(
        {"train": {k: v for k, v in TrainConfig().to_dict().items() if k != "compile"}}
    )
    assert identity({"train": TrainConfig(compile=True).to_dict()})["train"] == {"compile": True}
    assert TrainConfig.from_dict({"compile": True}).compile is True
    with pytest.raises(ConfigError, match="train.compile must be true or false, got 'yes'"):
        TrainConfig.from_dict({"compile": "yes"})


def test_a_path_with_a_space_is_a_clear_error_before_any_step_on_the_cpu(monkeypatch, tmp_path):
    """Inductor's C++ build passes these paths unquoted ("ld: cannot find ..."): train.compile on the CPU
    says so up front; the tests that compile CPU code skip with the same reason (fixture inductor_cpu).
    The paths are set here, so the test does not depend on the folder it runs in."""
    import longrange.train.compile as compile_module
    from longrange.train.compile import Compilation, build_paths, cpp_build_blocker

    root = tmp_path / "clean"
    clean = {
        what: str(root / name)
        for what, name in (
            ("PyTorch's package", "torch"),
            ("the environment's prefix", "venv"),
            ("Python's headers", "include"),
            ("Python's library directory", "lib"),
            ("Inductor's cache directory", "inductor"),
        )
    }
    monkeypatch.setattr(compile_module, "build_paths", lambda: dict(clean))
    assert cpp_build_blocker() is None
    spaced = str(tmp_path / "My Projects" / ".venv")
    monkeypatch.setattr(compile_module, "build_paths", lambda: {**clean, "the environment's prefix": spaced})
    assert f"the environment's prefix {spaced!r} holds whitespace" in cpp_build_blocker()
    with pytest.raises(
        ConfigError,
        match=r"train.compile on the CPU: the environment's prefix .* holds whitespace.*"
        r"set train.compile false",
    ):
        Compilation(True, "cpu")
    with pytest.raises(ConfigError, match="train.compile on the CPU"):
        compile_model(_model(FAST))
    Compilation(False, "cpu")  # eager: nothing is built
    Compilation(True, "cuda")  # Inductor builds Triton kernels there, not C++
    monkeypatch.setattr(
        compile_module, "build_paths", lambda: {**clean, "Inductor's cache directory": str(tmp_path / "inductor cache")}
    )
    assert "Inductor's cache directory" in cpp_build_blocker()
    # the real paths: Inductor's cache directory is where TORCHINDUCTOR_CACHE_DIR says
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    assert build_paths()["Inductor's cache directory"] == str(tmp_path / "cache")


# --------------------------------------------------------------------------------------------
# One graph per family, and the compiled step equals the eager step
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_family_traces_into_one_graph(name):
    """Dynamo alone (the "eager" backend): fullgraph=True raises at the first graph break."""
    model = _model(name)
    graphs = []

    def count(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(model, backend=count, fullgraph=True)
    _step(model, compiled)
    assert len(graphs) == 1


@pytest.mark.parametrize(
    "input_kind, head, pooling",
    [
        ("numeric", "classify", "max"),
        ("numeric", "regress", "last"),
        ("numeric", "tokens", "mean"),
        ("tokens", "retrieval", "cls"),
        ("numeric", "retrieval", "mean"),
    ],
)
def test_every_encoder_head_and_pooling_traces_into_one_graph(input_kind, head, pooling):
    """The families above take token inputs and a classification head with mean pooling; the numeric
    encoder, the other heads (two sequences for retrieval) and poolings trace into one graph too."""
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=1, d_model=16, d_state=4, block="mamba", primitive="s6", pooling=pooling)
    n_out = {"classify": 3, "regress": 2, "tokens": VOCAB, "retrieval": 2}[head]
    kw = dict(vocab_size=VOCAB) if input_kind == "tokens" else dict(d_input=2)
    model = build_model(cfg, input_kind=input_kind, head=head, n_out=n_out, **kw)
    inputs, lengths, _ = _batch()
    x = inputs if input_kind == "tokens" else torch.randn(*inputs.shape, 2, generator=torch.Generator().manual_seed(2))
    args = (x, lengths, x.flip(0), lengths.flip(0)) if head == "retrieval" else (x, lengths)
    graphs = []

    def count(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch.compile(model, backend=count, fullgraph=True)(*args).square().sum().backward()
    assert len(graphs) == 1


def _compiled_equals_eager(name):
    model = _model(name)
    eager_loss, eager_grads = _step(model, model)
    compile_model(model, fullgraph=True)
    assert is_compiled(model)
    loss, grads = _step(model, model)
    torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-6)
    assert grads.keys() == eager_grads.keys() and grads
    for key in grads:
        torch.testing.assert_close(grads[key], eager_grads[key], rtol=1e-4, atol=1e-5, msg=lambda m: f"{key}: {m}")
    restore(model)
    assert not is_compiled(model)


@pytest.mark.usefixtures("inductor_cpu")
def test_compiled_step_equals_eager_step():
    _compiled_equals_eager(FAST)


@pytest.mark.slow
@pytest.mark.usefixtures("inductor_cpu")
@pytest.mark.parametrize("name", sorted(set(FAMILIES) - {FAST}))
def test_compiled_step_equals_eager_step_every_family(name):
    _compiled_equals_eager(name)


@pytest.mark.slow
@pytest.mark.usefixtures("inductor_cpu")
def test_a_compiled_token_model_still_refuses_ids_outside_its_vocabulary():
    """The encoder's check by value is left out of the graph; the embedding's bounds check stays."""
    model = compile_model(_model(FAST), fullgraph=True)
    inputs, lengths, _ = _batch()
    model(inputs, lengths)
    with pytest.raises(RuntimeError, match="index out of bounds"):
        model(inputs.index_fill(1, torch.tensor([2]), VOCAB), lengths)


def test_the_record_of_kernels_counts_every_compiled_call_without_recompiling():
    """ops.used under compilation: a call of the operator note_used in the graph, no guard on the counts."""
    from longrange.ops.conv import causal_conv1d

    frames = []

    def count(gm, example_inputs):
        frames.append(gm)
        return gm.forward

    fn = torch.compile(lambda x, w: causal_conv1d(x, w).sum(), backend=count, fullgraph=True)
    x, w = torch.randn(2, 3, 7), torch.randn(3, 4)
    used.reset()
    for _ in range(4):
        fn(x, w)
    from longrange.ops.conv import auto_impl

    assert used.calls() == {"causal_conv1d": {auto_impl("cpu"): 4}} and len(frames) == 1


# --------------------------------------------------------------------------------------------
# Matrix products through oneDNN
# --------------------------------------------------------------------------------------------

needs_onednn = pytest.mark.skipif(not onednn_available(), reason="this PyTorch has no oneDNN")


@needs_onednn
def test_onednn_product_equals_the_float64_product_values_and_gradients():
    g = torch.Generator().manual_seed(0)
    a, b, bias = (torch.randn(*s, generator=g, dtype=torch.float64) for s in ((37, 24), (24, 9), (9,)))
    leaves = [t.float().requires_grad_() for t in (a, b, bias)]
    out = mm_onednn(*leaves)
    ref_leaves = [t.clone().requires_grad_() for t in (a, b, bias)]
    ref = ref_leaves[0] @ ref_leaves[1] + ref_leaves[2]
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    out.double().mul(ref.detach().cos()).sum().backward()
    ref.mul(ref.detach().cos()).sum().backward()
    for mine, theirs in zip(leaves, ref_leaves):
        torch.testing.assert_close(mine.grad.double(), theirs.grad, rtol=1e-4, atol=1e-5)
    # operands in other layouts: transposed, and a slice of a wider matrix (copied first)
    wide = torch.randn(24, 20, generator=g)
    torch.testing.assert_close(mm_onednn(a.float().t().contiguous().t(), wide[:, 3:12]), a.float() @ wide[:, 3:12])
    # a column-major first operand with a small or column-major second one: computed as (b.T a.T).T,
    # returned row-major like every other product
    col = a.float().t().contiguous().t()
    for other in (b.float(), b.float().t().contiguous().t(), torch.randn(24, 30, generator=g).t().contiguous().t()):
        out = mm_onednn(col, other)
        assert out.is_contiguous()
        torch.testing.assert_close(out, a.float() @ other, rtol=1e-5, atol=1e-5)


@needs_onednn
def test_onednn_product_refuses_bad_operands():
    with pytest.raises(ValueError, match=r"equal k, got \(3, 4\) and \(5, 2\)"):
        mm_onednn(torch.randn(3, 4), torch.randn(5, 2))
    with pytest.raises(ValueError, match=r"bias must have shape \(n,\)=\(2,\)"):
        mm_onednn(torch.randn(3, 4), torch.randn(4, 2), torch.randn(3))
    with pytest.raises(ValueError, match="float32 CPU tensors, got torch.float64"):
        mm_onednn(torch.randn(3, 4, dtype=torch.float64), torch.randn(4, 2, dtype=torch.float64))


@needs_onednn
@pytest.mark.usefixtures("inductor_cpu")
def test_compiled_cpu_graphs_route_their_matrix_products_to_onednn():
    lin = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2, bias=False))
    x = torch.randn(4, 6, requires_grad=True)
    routed = []

    class Counted(type(compile_options("cpu")["post_grad_custom_post_pass"])):
        def __call__(self, graph):
            routed.append(_route_matmuls(graph))

        def uuid(self):
            return None  # not cached: the pass runs at every compilation

    out = torch.compile(lin, options={"post_grad_custom_post_pass": Counted()})(x)
    out.square().sum().backward()
    assert routed == [2, 4]  # forward: addmm and mm; backward: both weights' and both inputs' gradients
    grad = x.grad.clone()
    x.grad = None
    torch.testing.assert_close(out, lin(x))
    lin(x).square().sum().backward()
    torch.testing.assert_close(grad, x.grad)
    assert "post_grad_custom_post_pass" not in compile_options(torch.device("meta"))


# --------------------------------------------------------------------------------------------
# A compiled run in the trainer
# --------------------------------------------------------------------------------------------

RUN = {
    "batch_size": 8,
    "epochs": 2,
    "lr": 0.01,
    "progress": False,
    "log_every": 2,
    "checkpoint_every": 3,
    "seed": 3,
    "compile": True,
}


class Interrupted(Exception):
    pass


def _trainer(path, cfg, resume=False):
    """The toy task at one length (no recompilation for a second shape), with dropout and input noise
    (random numbers in and around the compiled graph)."""
    model = toy_setup(dropout=0.1)[0]
    train_set, val_set = (ToyDataset(n, seed=s, min_len=6, max_len=6) for n, s in ((48, 1), (16, 2)))
    return Trainer(
        model, ToyObjective(noise=0.1), train_set, val_set, collate, cfg, path, tensorboard=False, resume=resume
    )


def _weights(path):
    return load_checkpoint(path / "checkpoints" / "last.pt")


@pytest.mark.usefixtures("inductor_cpu")
def test_compiled_run_trains_as_the_eager_run_and_resumes_to_the_uninterrupted_run(tmp_path):
    eager = _trainer(tmp_path / "eager", {**RUN, "compile": False})
    eager_summary = eager.fit()
    whole = _trainer(tmp_path / "whole", RUN)
    assert is_compiled(whole.model)
    whole_summary = whole.fit()
    assert not is_compiled(whole.model)  # eager again, as it was given
    a, e = _weights(tmp_path / "whole"), _weights(tmp_path / "eager")
    assert a["model"].keys() == e["model"].keys() == toy_setup()[0].state_dict().keys()  # no "_orig_mod." prefixes
    for key in a["model"]:
        torch.testing.assert_close(a["model"][key], e["model"][key], rtol=1e-4, atol=1e-6)
    assert whole_summary["final"]["loss"] == pytest.approx(eager_summary["final"]["loss"], rel=1e-4)

    broken = _trainer(tmp_path / "broken", RUN)

    def stop(step, path):
        if step == 6:
            raise Interrupted

    broken.on_checkpoint = stop
    with pytest.raises(Interrupted):
        broken.fit()
    assert _weights(tmp_path / "broken")["trainer"]["step"] == 6
    _trainer(tmp_path / "broken", RUN, resume=True).fit()
    b = _weights(tmp_path / "broken")
    assert a["trainer"]["step"] == b["trainer"]["step"] == 12 and b["config"]["compile"] is True
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    with pytest.raises(RunMismatchError, match="train.compile: True -> False"):
        _trainer(tmp_path / "broken", {**RUN, "compile": False}, resume=True)
