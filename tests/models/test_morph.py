"""F1 and F1R1 morphing of causal Mamba models into bidirectional ones."""

from __future__ import annotations

import pytest
import torch

from longrange.errors import ConfigError
from longrange.models.config import ModelConfig
from longrange.models.model import build_model
from longrange.models.morph import morph_f1, morph_f1r1


def _model(seed: int, **kw):
    torch.manual_seed(seed)
    cfg = ModelConfig(block="mamba", primitive=kw.pop("primitive", "s6"), n_layers=2, d_model=8, d_state=4, **kw)
    return build_model(cfg, input_kind="tokens", vocab_size=12, head="tokens", n_out=12).double().eval()


@pytest.mark.parametrize("primitive", ["s6", "s4d"])
def test_f1_reverse_branch_on_flipped_input_equals_pretrained_branch(primitive):
    causal = _model(0, primitive=primitive)
    morphed = morph_f1(causal).eval()
    u = torch.randn(2, 9, causal.backbone.blocks[0].d_inner, dtype=torch.float64)
    for old, new in zip(causal.backbone.blocks, morphed.backbone.blocks):
        assert new.direction == "bidirectional" and len(new.branches) == 2
        torch.testing.assert_close(new.branches[1](u.flip(1), None), old.branches[0](u.flip(1), None), rtol=0, atol=0)
        torch.testing.assert_close(new.branches[0](u, None), old.branches[0](u, None), rtol=0, atol=0)
        # The block output is the sum of the forward branch and the flipped reverse branch.
        x = torch.randn(2, 9, 8, dtype=torch.float64)
        h = new.norm(x)
        a, z = new.in_proj(h).chunk(2, -1)
        mixed = old.branches[0](a, None) + old.branches[0](a.flip(1), None).flip(1)
        expected = x + new.out_proj(mixed * torch.nn.functional.silu(z))
        torch.testing.assert_close(new(x), expected)
    # The causal model is unchanged, and the morphed one loads into a freshly built bidirectional model.
    fresh = build_model(
        causal.cfg.replace(direction="bidirectional"), input_kind="tokens", vocab_size=12, head="tokens", n_out=12
    )
    fresh.double().load_state_dict(morphed.state_dict())
    assert all(len(b.branches) == 1 for b in causal.backbone.blocks)


def test_f1r1_takes_reverse_branches_from_the_reverse_model():
    forward, reverse = _model(0), _model(1)
    fused = morph_f1r1(forward, reverse)
    for f, r, new in zip(forward.backbone.blocks, reverse.backbone.blocks, fused.backbone.blocks):
        for (name, p), q in zip(new.branches[1].named_parameters(), r.branches[0].parameters()):
            assert torch.equal(p, q), name
        for p, q in zip(new.branches[0].parameters(), f.branches[0].parameters()):
            assert torch.equal(p, q)
        assert torch.equal(new.in_proj.weight, f.in_proj.weight)
    assert torch.equal(fused.encoder.embedding.weight, forward.encoder.embedding.weight)


def test_morph_refuses_non_causal_or_mismatched_models():
    with pytest.raises(ConfigError, match="causal Mamba"):
        morph_f1(_model(0, direction="bidirectional"))
    with pytest.raises(ConfigError, match="differ"):
        morph_f1r1(_model(0), _model(1, primitive="s4d"))
