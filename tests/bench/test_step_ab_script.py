"""benchmarks/step_ab.py: each "before" path it times computes what the current code computes (so
the A/B compares the same work), and one tiny measurement runs end to end."""

from __future__ import annotations

from pathlib import Path

import repo_scripts
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "step_ab.py"


def _module():
    return repo_scripts.load(SCRIPT)


def test_the_before_paths_compute_what_the_current_code_computes():
    ab = _module()
    from longrange.models.backbone import make_primitive

    torch.manual_seed(0)
    for name in ("s4d", "dlr"):
        layer = make_primitive(name, 8, d_state=4).double()
        x = torch.randn(2, 12, 8, dtype=torch.float64)
        now = layer(x)
        with ab.before(name, "layouts"):
            then = layer(x)
        assert now.is_contiguous() and not then.is_contiguous()
        torch.testing.assert_close(now, then, rtol=0, atol=0)
    log_decay = torch.complex(-torch.rand(5, dtype=torch.float64), torch.rand(5, dtype=torch.float64))
    v = torch.randn(2, 37, 5, dtype=torch.complex128)
    for h0 in (None, torch.randn(2, 5, dtype=torch.complex128)):
        got = ab.complex_chunked._scan(log_decay, v, h0, 4, "loop")
        torch.testing.assert_close(got, ab.lru_scan_before(log_decay, v, h0, 4, "loop"), rtol=1e-12, atol=1e-12)
    x = torch.randn(2, 3, 6, 7, dtype=torch.float64)
    cos, sin = torch.rand(6, 3, dtype=torch.float64), torch.rand(6, 3, dtype=torch.float64)
    torch.testing.assert_close(ab.rope.apply_rotary(x, cos, sin), ab.rotary_before(x, cos, sin), rtol=1e-12, atol=1e-12)
    from longrange.ops.matrix_state.dispatch import gated_delta_rule

    q, k, v = (torch.randn(2, 40, 2, 8, dtype=torch.float64) for _ in range(3))
    g, beta = -torch.rand(2, 40, 2, dtype=torch.float64), torch.rand(2, 40, 2, dtype=torch.float64)
    k = torch.nn.functional.normalize(k, dim=-1)
    now = gated_delta_rule(q, k, v, g, beta)
    with ab.before("gated-deltanet", "layouts"):
        assert ab.delta_rule.default_chunk_size(k) == 64
        torch.testing.assert_close(gated_delta_rule(q, k, v, g, beta), now, rtol=1e-10, atol=1e-10)


def test_the_fft_convolutions_before_path_computes_its_values_and_gradients():
    ab = _module()
    u, k = torch.randn(2, 3, 10, dtype=torch.float64), torch.randn(3, 20, dtype=torch.float64)
    now = [t.clone().requires_grad_() for t in (u, k)]
    then = [t.clone().requires_grad_() for t in (u, k)]
    y_now, y_then = ab.fftconv._fft_conv_core(*now, 20), ab.fft_core_before(*then, 20)
    torch.testing.assert_close(y_now, y_then, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(y_now)
    y_now.backward(g), y_then.backward(g)
    for a, b in zip(now, then):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-12)
    with ab.before("s4d", "fft-backward"):
        assert ab.fftconv._fft_conv_core is ab.fft_core_before
    assert ab.fftconv._fft_conv_core is not ab.fft_core_before


def test_the_direct_convolutions_before_path_runs_the_fft():
    ab = _module()
    from longrange.ops import used

    u, k = torch.randn(2, 3, 10, dtype=torch.float64), torch.randn(3, 10, dtype=torch.float64)
    used.reset()
    now = ab.fftconv.fft_conv(u, k)
    with ab.before("hyena", "direct-conv"):
        then = ab.fftconv.fft_conv(u, k)
    ab.fftconv.fft_conv(u, k)
    assert used.calls()["fft_conv"] == {"direct": 2, "fft": 1}
    torch.testing.assert_close(now, then, rtol=1e-12, atol=1e-12)


def test_the_unmasked_rounds_before_path_masks_every_batch():
    ab = _module()
    from longrange.models.config import ModelConfig
    from longrange.models.model import build_model

    cfg = ModelConfig(block="mamba", primitive="s6", n_layers=1, d_model=8, d_state=4)
    model = build_model(cfg, input_kind="numeric", head="classify", n_out=3, d_input=2).double().eval()
    seen = []
    model.backbone.register_forward_pre_hook(lambda module, args: seen.append(args[1]))
    x = torch.randn(2, 5, 2, dtype=torch.float64)
    now = model(x)
    with ab.before("hyena", "unmasked"):
        then = model(x)
    assert seen[0] is None and bool(seen[1].all())
    torch.testing.assert_close(now, then, rtol=1e-12, atol=1e-12)


def test_the_dense_layouts_before_paths_compute_what_the_current_code_computes():
    """The skip beside the convolution and the transposed views compute the same values and
    gradients as the folded skip and the dense layouts, and every patch is undone."""
    ab = _module()
    from longrange.models.backbone import make_primitive

    shift, forward = ab.h3_module.H3.shift, ab.hyena_module.Hyena.forward
    for name, options in (("s4d", {"d_state": 4}), ("h3", {"d_state": 4}), ("hyena", {"l_max": 12})):
        torch.manual_seed(0)
        layer = make_primitive(name, 8, **options).double()
        x = torch.randn(2, 12, 8, dtype=torch.float64, requires_grad=True)
        out = {}
        for which in ("now", "before"):
            if which == "before":
                with ab.before(name, "dense-layouts"):
                    assert ab.fftconv._convolve is ab.convolve_skip_beside
                    y = layer(x)
            else:
                y = layer(x)
            (grad,) = torch.autograd.grad((y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum(), x)
            out[which] = (y.detach(), grad)
        for a, b in zip(out["now"], out["before"]):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert ab.fftconv._convolve is ab._CONVOLVE and ab.h3_module.H3.shift is shift
    assert ab.hyena_module.Hyena.forward is forward


def test_the_channels_last_rounds_before_paths_compute_what_the_current_code_computes():
    """The layers transposed around a channels-first convolution padded by ``rfft(u, n=n)``, and the
    channels-last convolution: the same values and gradients, causal and bidirectional; every patch
    is undone."""
    ab = _module()
    from longrange.models.backbone import make_primitive

    patched = [(owner, name, getattr(owner, name)) for owner, name, _ in ab.ROUNDS["channels-last-conv"]["h3"]]
    patched.append((ab.hyena_module.Hyena, "forward", ab.hyena_module.Hyena.forward))
    for name, options in (
        ("s4d", {"d_state": 4}),
        ("dlr", {"d_state": 4}),
        ("h3", {"d_state": 4}),
        ("hyena", {"l_max": 40}),
    ):
        for bidirectional in (False, True):
            torch.manual_seed(0)
            layer = make_primitive(name, 8, bidirectional=bidirectional, **options).double()
            x = torch.randn(2, 40, 8, dtype=torch.float64, requires_grad=True)  # past the direct product's 24
            out = {}
            for which in ("now", "before"):
                if which == "before":
                    with ab.before(name, "channels-last-conv"):
                        y = layer(x)
                else:
                    y = layer(x)
                weights = torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view_as(y)
                out[which] = (y.detach(), *torch.autograd.grad((y * weights).sum(), [x, *layer.parameters()]))
            for a, b in zip(out["now"], out["before"]):
                torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    for owner, name, current in patched:
        assert getattr(owner, name) is current


def test_the_narrow_attention_before_paths_compute_what_the_current_code_computes():
    """PyTorch's attention kernel for MAD's narrow heads, and the FFT backward through the conjugate
    view, give the current code's values and gradients; every patch is undone."""
    ab = _module()
    from longrange.models.backbone import make_primitive
    from longrange.ops import used

    backward = ab.fftconv._FFTConv.backward
    for name, options in (("attention", {"n_heads": 4}), ("s4d", {"d_state": 4}), ("hyena", {"l_max": 12})):
        torch.manual_seed(0)
        layer = make_primitive(name, 16, **options).double()
        x = torch.randn(2, 12, 16, dtype=torch.float64, requires_grad=True)
        out = {}
        for which in ("now", "before"):
            used.reset()
            if which == "before":
                with ab.before("transformer" if name == "attention" else name, "narrow-attention"):
                    y = layer(x)
            else:
                y = layer(x)
            (grad,) = torch.autograd.grad((y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum(), x)
            out[which] = (y.detach(), grad)
            if name == "attention":
                assert used.kernels()["attention"] == ("numba" if which == "now" else "sdpa")
        for a, b in zip(out["now"], out["before"]):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert ab.fftconv._FFTConv.backward is backward
    assert ab.attention_dispatch.NUMBA_MAX_WIDTH == 8 and ab.attention_dispatch.NUMBA_MAX_WIDTH_BIDIRECTIONAL == 4


def test_a_tiny_measurement_restores_the_current_code(tmp_path):
    ab = _module()
    current, threads = ab.rope.apply_rotary, torch.get_num_threads()
    args = ["--round", "layouts", "--models", "transformer", "--steps", "1", "--batch-size", "2", "--seq-len", "16"]
    try:
        assert ab.main([*args, "--json", str(tmp_path / "ab.json")]) == 0
    finally:
        torch.set_num_threads(threads)  # main() measures on one thread
    assert ab.rope.apply_rotary is current
    assert "transformer" in (tmp_path / "ab.json").read_text()


def test_the_denormals_round_times_both_modes_and_leaves_them_flushed(tmp_path):
    ab = _module()
    from longrange.train.denormals import flushing

    threads = torch.get_num_threads()
    try:
        args = ["--round", "denormals", "--models", "lru", "--steps", "1", "--batch-size", "2", "--seq-len", "16"]
        assert ab.main([*args, "--json", str(tmp_path / "ab.json")]) == 0
        assert flushing()  # as training leaves the thread
    finally:
        torch.set_num_threads(threads)
        torch.set_flush_denormal(False)
    assert '"before_ms"' in (tmp_path / "ab.json").read_text()


def test_mad_mode_names_the_layers_it_measures():
    import pytest

    ab = _module()
    with pytest.raises(SystemExit):
        ab.main(["--round", "layouts", "--mad", "--models", "s4d"])  # not a layer of MAD's
    with pytest.raises(SystemExit):
        ab.main(["--models", "nope"])  # not a model of the latest round
    exp = ab.experiment("gla", 256, mad=True)
    assert exp.task.name == "mad-in-context-recall" and exp.model.n_heads == 8  # MAD's mh-gated-linear-attention


def test_the_narrow_keys_before_path_runs_the_chunked_form():
    """The recall preset's Gated DeltaNet heads (32 x 64): numba now, the chunked form before, the
    same values and gradients; the patch is undone."""
    ab = _module()
    from longrange.ops import used
    from longrange.ops.matrix_state.dispatch import gated_delta_rule

    torch.manual_seed(0)
    q, k = (torch.randn(2, 20, 2, 32, dtype=torch.float64, requires_grad=True) for _ in range(2))
    v = torch.randn(2, 20, 2, 64, dtype=torch.float64, requires_grad=True)
    g, beta = -torch.rand(2, 20, 2, dtype=torch.float64), torch.rand(2, 20, 2, dtype=torch.float64)
    out = {}
    for which in ("now", "before"):
        used.reset()
        if which == "before":
            with ab.before("gated-deltanet", "narrow-keys"):
                o, _ = gated_delta_rule(q, k, v, g, beta, normalize_qk=True)
        else:
            o, _ = gated_delta_rule(q, k, v, g, beta, normalize_qk=True)
        assert used.kernels()["gated_delta_rule"] == ("numba" if which == "now" else "chunk")
        out[which] = (o.detach(), *torch.autograd.grad(o.square().sum(), [q, k, v]))
    for a, b in zip(out["now"], out["before"]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    assert ab.matrix_state_numba.AUTO_KEY_WIDTH == 32


def test_the_mamba3_rounds_before_path_runs_the_chunked_form():
    ab = _module()
    from longrange.models.backbone import make_primitive
    from longrange.ops import used

    torch.manual_seed(0)
    layer = make_primitive("mamba3", 64, d_state=16).double()  # the recall preset's heads of 16 x 64
    x = torch.randn(2, 20, 64, dtype=torch.float64, requires_grad=True)
    out = {}
    for which in ("now", "before"):
        used.reset()
        if which == "before":
            with ab.before("mamba3", "mamba3-numba"):
                y = layer(x)
        else:
            y = layer(x)
        assert used.kernels()["mamba3"] == ("numba" if which == "now" else "chunk")
        out[which] = (y.detach(), *torch.autograd.grad(y.square().sum(), [x, *layer.parameters()]))
    for a, b in zip(out["now"], out["before"]):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)
    assert ab.matrix_state_dispatch.DISPATCHERS["mamba3"].default == "auto"


def test_the_fused_softplus_rounds_before_path_computes_what_the_current_code_computes():
    """S6 at the recall preset's width (the channels-last kernels): the step's bias and softplus by
    PyTorch before the kernel, or in it, give the same values and gradients (the bias's too), in
    float64 and float32; the patch is undone."""
    ab = _module()
    from longrange.models.backbone import make_primitive

    current = ab.scan_numba.selective_scan_numba
    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 2e-5)):
        torch.manual_seed(0)
        layer = make_primitive("s6", 64, d_state=16).to(dtype)
        x = torch.randn(2, 20, 64, dtype=dtype, requires_grad=True)
        out = {}
        for which in ("now", "before"):
            if which == "before":
                with ab.before("simple-s6", "fused-softplus"):
                    assert ab.scan_numba.selective_scan_numba is ab.selective_scan_numba_before
                    y = layer(x)
            else:
                y = layer(x)
            out[which] = (y.detach(), *torch.autograd.grad(y.square().sum(), [x, *layer.parameters()]))
        assert layer.dt_proj.bias.requires_grad
        for a, b in zip(out["now"], out["before"]):
            torch.testing.assert_close(a, b, rtol=tol, atol=tol)
    assert ab.scan_numba.selective_scan_numba is current


def test_the_direct_calls_rounds_before_path_sends_every_call_through_the_dispatcher():
    ab = _module()
    assert ab.custom_ops.EAGER_CALLS
    with ab.before("mamba2", "direct-calls"):
        assert not ab.custom_ops.EAGER_CALLS
        assert not ab.custom_ops.direct_call_allowed((torch.ones(2),))
    assert ab.custom_ops.EAGER_CALLS and ab.custom_ops.direct_call_allowed((torch.ones(2),))


def test_the_recall_models_long_filters_are_built_for_the_length_measured():
    ab = _module()
    for name in ("hyena", "base-conv"):
        model = ab.experiment(name, 48, mad=False).model.to_dict()
        found = [model["primitive_options"].get("l_max")]
        found += [
            (entry.get("options") or {}).get("l_max") for entry in model.get("layers") or [] if isinstance(entry, dict)
        ]
        assert 48 in found and all(v in (None, 48) for v in found), (name, found)
