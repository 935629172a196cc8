"""Hugging Face causal LMs as baselines (block hf), on a tiny GPT-NeoX written locally: build,
padding, the SPT token mapping, stepping, the errors for missing files and a missing package."""

from __future__ import annotations

import sys

import pytest
import torch

from longrange.errors import ConfigError, DataMissingError
from longrange.models.config import ModelConfig
from longrange.models.model import build_model, parameter_report

transformers = pytest.importorskip("transformers")
from hf_tiny import WORDS, write_tiny_lm  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf") / "tiny-neox"
    lm = write_tiny_lm(root)
    return root, lm


def hf_cfg(path, **kw) -> ModelConfig:
    hf = {"model": str(path), **kw.pop("hf", {})}
    return ModelConfig(block="hf", hf=hf, **kw)


def test_random_init_from_the_local_config_with_overrides(tiny):
    root, _ = tiny
    torch.manual_seed(0)
    model = build_model(
        hf_cfg(root, hf={"config": {"num_hidden_layers": 1}}), input_kind="numeric", d_input=3, head="classify", n_out=4
    )
    lm = model.backbone.lm
    assert type(lm).__name__ == "GPTNeoXModel" and lm.config.num_hidden_layers == 1 and len(lm.layers) == 1
    report = parameter_report(model)
    assert report["head"] == 32 * 4 + 4 and report["encoder"] == 3 * 32 + 32
    assert report["total"] == sum(p.numel() for p in model.parameters())
    assert report["in_primitives"] == sum(p.numel() for p in lm.layers[0].attention.parameters())
    assert model(torch.randn(2, 7, 3)).shape == (2, 4)


def test_pretrained_weights_are_the_snapshot_s(tiny):
    root, lm = tiny
    model = build_model(
        hf_cfg(root, hf={"pretrained": True}), input_kind="numeric", d_input=1, head="classify", n_out=2
    )
    for name, value in lm.gpt_neox.state_dict().items():
        assert torch.equal(model.backbone.lm.state_dict()[name], value), name


@pytest.mark.parametrize("pooling", ["mean", "last", "max", "cls"])
@pytest.mark.parametrize("input_kind", ["numeric", "tokens"])
def test_padding_does_not_change_outputs(tiny, pooling, input_kind):
    root, _ = tiny
    torch.manual_seed(0)
    cfg = hf_cfg(root, pooling=pooling, head_layers=2)
    kw = dict(d_input=2) if input_kind == "numeric" else dict(vocab_size=12)
    model = build_model(cfg, input_kind=input_kind, head="classify", n_out=3, **kw).double().eval()
    lengths = torch.tensor([9, 4, 6])
    x = torch.randn(3, 9, 2, dtype=torch.float64) if input_kind == "numeric" else torch.randint(5, 12, (3, 9))
    alone = torch.cat([model(x[i : i + 1, : int(n)]) for i, n in enumerate(lengths)])
    padded = x.clone()
    for i, n in enumerate(lengths):
        padded[i, int(n) :] = 100.0 if input_kind == "numeric" else 7
    torch.testing.assert_close(model(padded, lengths), alone, rtol=1e-7, atol=1e-9)


def test_pretrained_token_mapping_follows_the_spt_code(tiny):
    """Each task token goes through the LM's tokenizer; '[MAX' becomes '[' 'MAX' (SPT's ListOps
    mapping); specials map to the end-of-text/padding tokens, <cls> and <mask> to new rows."""
    root, _ = tiny
    vocab = ["[MAX", "]", "7", "a"]
    model = (
        build_model(
            hf_cfg(root, hf={"pretrained": True}),
            input_kind="tokens",
            vocab_size=9,
            head="tokens",
            n_out=9,
            vocab=vocab,
        )
        .double()
        .eval()
    )
    mapping = model.rebuild_info()["token_map"]
    n_words = len(WORDS)
    assert mapping == [[1], [0], [0], [n_words], [n_words + 1], [2, 4], [3], [15], [18]]
    # Outputs at task positions are the LM's hidden states at the last LM token of each task token.
    x = torch.tensor([[5, 7, 6], [5, 8, 0]])  # "[MAX 7 ]", "[MAX a" + padding
    lengths = torch.tensor([3, 2])
    out = model(x, lengths)
    ids = torch.tensor([[2, 4, 15, 3]])
    h = model.backbone.lm(input_ids=ids).last_hidden_state[0]
    torch.testing.assert_close(out[0], model.head(h[[1, 2, 3]]))
    h2 = model.backbone.lm(input_ids=torch.tensor([[2, 4, 18]])).last_hidden_state[0]
    torch.testing.assert_close(out[1, :2], model.head(h2[[1, 2]]))
    # A classification head pools over the LM tokens (here: the last real one).
    model.replace_head("classify", 2)
    model.head.pooling = "last"
    torch.testing.assert_close(model(x, lengths)[0], model.head.linear(h[3]))


def test_a_pretrained_lm_on_tokens_needs_the_vocabulary(tiny):
    root, _ = tiny
    with pytest.raises(ConfigError, match="needs the task's vocabulary"):
        build_model(hf_cfg(root, hf={"pretrained": True}), input_kind="tokens", vocab_size=9, head="classify", n_out=2)
    with pytest.raises(ConfigError, match="vocab_size"):
        build_model(hf_cfg(root), input_kind="tokens", vocab_size=100, head="classify", n_out=2)


def test_step_equals_forward(tiny):
    root, _ = tiny
    torch.manual_seed(0)
    model = build_model(hf_cfg(root), input_kind="tokens", vocab_size=12, head="tokens", n_out=12).double().eval()
    x = torch.randint(0, 12, (2, 8))
    parallel = model(x)
    state = model.default_state(2)
    steps = []
    for t in range(8):
        y, state = model.step(x[:, t], state)
        steps.append(y)
    torch.testing.assert_close(torch.stack(steps, 1), parallel, rtol=1e-7, atol=1e-9)


def _graphs(model, x, lengths, fullgraph: bool) -> int:
    """The graphs Dynamo makes of a training step's forward (loss and gradients computed eagerly from them)."""
    graphs = []

    def count(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    try:
        torch.compile(model, backend=count, fullgraph=fullgraph)(x, lengths).square().sum().backward()
    finally:
        torch._dynamo.reset()
        model.zero_grad(set_to_none=True)
    return len(graphs)


@pytest.mark.parametrize("input_kind", ["numeric", "tokens"])
def test_compiles_into_one_graph(tiny, input_kind):
    """``fullgraph=True``: the ids' range check by value is left out while compiling (eager mode keeps it)."""
    root, _ = tiny
    torch.manual_seed(0)
    kw = dict(d_input=2) if input_kind == "numeric" else dict(vocab_size=12)
    model = build_model(hf_cfg(root), input_kind=input_kind, head="classify", n_out=3, **kw)
    x = torch.randn(3, 9, 2) if input_kind == "numeric" else torch.randint(5, 12, (3, 9))
    assert _graphs(model, x, torch.tensor([9, 4, 6]), fullgraph=True) == 1
    if input_kind == "tokens":
        with pytest.raises(ValueError, match="token id 12 is outside the vocabulary of size 12"):
            model(x.index_fill(1, torch.tensor([2]), 12))


def test_a_token_map_that_expands_splits_the_graph_and_compiles_as_eager(tiny):
    """A task token the tokenizer splits makes the LM sequence's length depend on the ids: Dynamo
    cannot trace it (``fullgraph=True`` fails); with its graph breaks (``fullgraph=False``, as the trainer
    compiles) the compiled step equals the eager one (AOTAutograd's graphs run eagerly: Inductor's code
    for each is checked on the other families in ``tests/train/test_compile.py``)."""
    from longrange.train.compile import restore

    root, _ = tiny
    torch.manual_seed(0)
    model = build_model(
        hf_cfg(root, hf={"pretrained": True}),
        input_kind="tokens",
        vocab_size=9,
        head="classify",
        n_out=3,
        vocab=["[MAX", "]", "7", "a"],
    )
    x, lengths = torch.tensor([[5, 7, 6, 8], [5, 8, 7, 0]]), torch.tensor([4, 3])
    with pytest.raises(Exception, match="data-dependent"):
        _graphs(model, x, lengths, fullgraph=True)
    assert _graphs(model, x, lengths, fullgraph=False) > 1

    def step():
        loss = model(x, lengths).square().sum()
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        return loss.detach(), grads

    model.eval()  # no dropout: the same step twice
    eager = step()
    torch._dynamo.reset()
    try:
        model.compile(backend="aot_eager")
        compiled = step()
    finally:
        restore(model)
        torch._dynamo.reset()
    torch.testing.assert_close(compiled[0], eager[0])
    assert compiled[1].keys() == eager[1].keys() and compiled[1]
    for name in eager[1]:
        torch.testing.assert_close(compiled[1][name], eager[1][name], msg=lambda m: f"{name}: {m}")


def test_rebuild_without_the_snapshot_gives_the_same_model(tiny, tmp_path):
    root, _ = tiny
    cfg = hf_cfg(root, hf={"pretrained": True})
    model = build_model(cfg, input_kind="tokens", vocab_size=7, head="classify", n_out=2, vocab=["[MAX", "9"]).eval()
    info = model.rebuild_info()
    moved = ModelConfig(block="hf", hf={"model": str(tmp_path / "gone"), "pretrained": True})
    again = build_model(moved, input_kind="tokens", vocab_size=7, head="classify", n_out=2, hf_resolved=info).eval()
    again.load_state_dict(model.state_dict())
    x = torch.tensor([[5, 6, 5]])
    torch.testing.assert_close(again(x), model(x), rtol=0, atol=0)


def test_missing_files_are_errors_saying_how_to_download(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    no_weights = tmp_path / "config-only"
    write_tiny_lm(no_weights, weights=False, tokenizer=False)
    build_model(hf_cfg(no_weights), input_kind="numeric", head="classify", n_out=2)  # random init needs no weights
    with pytest.raises(DataMissingError, match=r"pretrained weights .*huggingface-cli download .*config-only") as err:
        build_model(hf_cfg(no_weights, hf={"pretrained": True}), input_kind="numeric", head="classify", n_out=2)
    assert f"the directory {no_weights}" in str(err.value)
    with pytest.raises(
        DataMissingError,
        match=r"'EleutherAI/pythia-no-such'.*configuration .*Hugging Face cache .*"
        r"`huggingface-cli download EleutherAI/pythia-no-such --revision step1`",
    ):
        build_model(
            ModelConfig(block="hf", hf={"model": "EleutherAI/pythia-no-such", "revision": "step1"}),
            input_kind="numeric",
            head="classify",
            n_out=2,
        )


def test_missing_transformers_names_the_extra(tiny, monkeypatch):
    root, _ = tiny
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ConfigError, match=r"pip install 'longrange\[hf\]'"):
        build_model(hf_cfg(root), input_kind="numeric", head="classify", n_out=2)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(block="hf"), "model.hf.model"),
        (dict(block="hf", hf={"model": "x", "weights": True}), "unknown model.hf key"),
        (dict(block="hf", hf={"model": "x", "pretrained": "yes"}), "model.hf.pretrained"),
        (dict(block="hf", hf={"model": "x"}, direction="bidirectional"), "model.direction must be 'causal'"),
        (dict(block="mamba", hf={"model": "x"}), "model.hf applies to model.block 'hf'"),
    ],
)
def test_config_errors(kw, match):
    with pytest.raises(ConfigError, match=match):
        ModelConfig(**kw)


def test_special_token_roles_follow_the_vocabulary_order():
    # models may not import data (layering): hf.py keeps its own list of the specials, held equal here.
    from longrange.data.tokenize import SPECIALS
    from longrange.models.hf import _SPECIAL_ROLES

    assert tuple(_SPECIAL_ROLES) == SPECIALS
