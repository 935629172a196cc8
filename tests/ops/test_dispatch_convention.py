"""One convention for every op with several implementations (:mod:`longrange.ops.dispatch`): the
same verbs on every registered dispatcher, the same errors, defaults that restore, the registry,
and ``longrange check`` / ``longrange info`` listing every registered op."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch

from longrange import _optional, check
from longrange.cli import main
from longrange.info import format_info, info_table
from longrange.ops import complex_scan, conv, scan, ssm_kernels, used
from longrange.ops.dispatch import DISPATCHERS, FAMILIES, Dispatcher, Impl, dispatcher

#: The ops ported onto the convention by this package's own families.
CORE = {"selective_scan", "causal_conv1d", "vandermonde", "cauchy", "complex_diag_scan"}


def _dispatchers() -> list[Dispatcher]:
    return list(DISPATCHERS.values())


def _toy(**kwargs) -> Dispatcher:
    """A dispatcher outside the registry: "fast" on CUDA only (non-deterministic), "chunked", "ref"."""
    return Dispatcher(
        "toy",
        [
            Impl(
                "fast",
                runs=lambda device: device.type == "cuda",
                reason=lambda device: "needs a GPU",
                deterministic=False,
                nondeterministic="atomic additions",
            ),
            Impl("chunked"),
            Impl("ref", auto=False),
        ],
        function="toy_op",
        register=False,
        **kwargs,
    )


@pytest.fixture
def deterministic():
    before, warn_only = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(before, warn_only=warn_only)


# --------------------------------------------------------------------------------------------
# The registry
# --------------------------------------------------------------------------------------------


def test_the_families_register_their_ops():
    assert CORE <= set(DISPATCHERS)
    assert len(FAMILIES) == len(set(FAMILIES))
    assert DISPATCHERS["selective_scan"] is scan.DISPATCHER and DISPATCHERS["causal_conv1d"] is conv.DISPATCHER
    assert DISPATCHERS["vandermonde"] is ssm_kernels.VANDERMONDE_DISPATCHER
    assert DISPATCHERS["cauchy"] is ssm_kernels.CAUCHY_DISPATCHER
    assert DISPATCHERS["complex_diag_scan"] is complex_scan.DISPATCHER
    assert "longrange.ops.complex_scan.dispatch" in FAMILIES
    for op, d in DISPATCHERS.items():
        assert d.op == op


def test_dispatcher_lookup_by_op_or_function_and_did_you_mean():
    assert dispatcher("cauchy") is DISPATCHERS["cauchy"]
    assert dispatcher("vandermonde_kernel") is DISPATCHERS["vandermonde"]
    with pytest.raises(ValueError, match=r"no dispatcher for the op 'selective_scn'; did you mean 'selective_scan'\?"):
        dispatcher("selective_scn")
    with pytest.raises(ValueError, match="registered: .*causal_conv1d"):
        dispatcher("nothing like it")


def test_two_dispatchers_for_one_op_are_refused():
    with pytest.raises(ValueError, match="two dispatchers for the op 'cauchy'"):
        Dispatcher("cauchy", [Impl("other"), Impl("ref")])
    assert dispatcher("cauchy") is ssm_kernels.CAUCHY_DISPATCHER


def test_bad_implementation_lists_are_refused():
    with pytest.raises(ValueError, match="distinct"):
        Dispatcher("toy", [Impl("ref"), Impl("ref")], register=False)
    with pytest.raises(ValueError, match="none named 'auto'"):
        Dispatcher("toy", [Impl("auto"), Impl("ref")], register=False)
    with pytest.raises(ValueError, match="the reference 'ref' is not one of"):
        Dispatcher("toy", [Impl("chunked")], register=False)


def test_importing_the_convention_imports_no_kernel_package_and_no_op():
    code = (
        "import sys; import longrange.ops.dispatch; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('numba', 'triton') "
        "or m.startswith(('longrange.ops.scan', 'longrange.ops.conv', 'longrange.ops.ssm_kernels'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --------------------------------------------------------------------------------------------
# The same verbs everywhere
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["cpu", "meta"])
def test_every_dispatcher_offers_the_same_verbs(where):
    for d in _dispatchers():
        assert d.IMPLS == ("auto", *d.impls) and isinstance(d.IMPLS, tuple)
        assert set(d.deterministic_backward) == set(d.impls)
        assert all(isinstance(v, bool) for v in d.deterministic_backward.values())
        available = d.available_impls(where)
        assert isinstance(available, tuple) and available == tuple(i for i in d.impls if i in available)
        assert d.reference in available  # the reference runs anywhere
        assert set(d.deterministic_impls(where)) <= set(available)
        assert d.auto_impl(where) in d.impls
        assert d.resolve("auto", where) == d.auto_impl(where)
        assert d.resolve(None, where) == d.auto_impl(where)  # the default is "auto"
        for impl in available:
            assert d.unavailable_reason(impl, where) is None
            assert d.resolve(impl, where) == impl
        for impl in set(d.impls) - set(available):
            assert d.unavailable_reason(impl, where)
        assert d.function and callable(d.set_default_impl) and callable(d.default_impl) and callable(d.note)


def test_the_modules_verbs_are_their_dispatchers():
    assert scan.IMPLS == scan.DISPATCHER.IMPLS and conv.IMPLS == conv.DISPATCHER.IMPLS
    assert scan.DETERMINISTIC_BACKWARD is scan.DISPATCHER.deterministic_backward
    assert conv.DETERMINISTIC_BACKWARD is conv.DISPATCHER.deterministic_backward
    for op in ssm_kernels.OPS:
        assert ssm_kernels.IMPLS[op] == dispatcher(op).impls
        assert ssm_kernels.DETERMINISTIC_BACKWARD[op] is dispatcher(op).deterministic_backward
        assert ssm_kernels.available_impls(op, "cpu") == list(dispatcher(op).available_impls("cpu"))
        assert ssm_kernels.auto_impl(op, "meta") == dispatcher(op).auto_impl("meta")
    # The scan's and the convolution's module functions list the implementations slowest first, as before.
    assert scan.available_impls("cpu") == tuple(reversed(scan.DISPATCHER.available_impls("cpu")))
    assert conv.available_impls("cpu") == tuple(reversed(conv.DISPATCHER.available_impls("cpu")))
    assert scan.auto_impl("cpu") == scan.DISPATCHER.auto_impl("cpu")
    assert conv.auto_impl("cuda", 5) == conv.DISPATCHER.auto_impl("cuda", width=5)


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


def test_an_unknown_impl_is_a_value_error_naming_the_op_and_its_choices():
    for d in _dispatchers():
        for call in (
            lambda: d.resolve("fast-as-light", "cpu"),
            lambda: d.set_default_impl("fast-as-light"),
            lambda: d.unavailable_reason("fast-as-light", "cpu"),
        ):
            with pytest.raises(ValueError) as err:
                call()
            message = str(err.value)
            assert message.startswith(f"{d.function}: unknown impl 'fast-as-light'; expected one of ")
            assert all(repr(impl) in message for impl in d.IMPLS)


def test_the_ops_refuse_an_unknown_impl_alike():
    x = torch.randn(1, 2, 5)
    for call, function in (
        (lambda: conv.causal_conv1d(x, torch.randn(2, 3), impl="fast"), "causal_conv1d"),
        (
            lambda: scan.selective_scan(
                x, x, -torch.ones(2, 1), torch.randn(1, 1, 5), torch.randn(1, 1, 5), impl="fast"
            ),
            "selective_scan",
        ),
        (
            lambda: ssm_kernels.cauchy(
                torch.randn(2, 3, dtype=torch.complex64),
                torch.randn(2, 4, dtype=torch.complex64),
                torch.randn(2, 3, dtype=torch.complex64),
                impl="fast",
            ),
            "cauchy",
        ),
    ):
        with pytest.raises(ValueError, match=rf"^{function}: unknown impl 'fast'; expected one of \('auto', "):
            call()


@pytest.mark.parametrize("where", ["cpu", "meta"])
def test_an_impl_that_cannot_run_here_says_why_and_what_can(where):
    tried = 0
    for d in _dispatchers():
        available = d.available_impls(where)
        for impl in (i for i in d.impls if i not in available):
            with pytest.raises(RuntimeError) as err:
                d.resolve(impl, where)
            assert str(err.value) == (
                f"{d.function}: impl={impl!r} {d.unavailable_reason(impl, where)}; "
                f"available here: {', '.join(available)}"
            )
            tried += 1
    assert tried  # numba runs on no meta tensor, Triton and CUDA kernels on no CPU tensor without an interpreter


def test_an_impl_that_cannot_take_the_inputs_says_why(monkeypatch):
    monkeypatch.setattr(_optional, "causal_conv1d_cuda_fn", object())  # as if causal-conv1d's kernel imported
    d = conv.DISPATCHER
    assert d.resolve("cuda", "cuda", width=4) == "cuda"
    assert d.auto_impl("cuda", deterministic=False, width=5) == "torch"
    with pytest.raises(
        RuntimeError,
        match=r"causal_conv1d: impl='cuda' takes a width in \(2, 3, 4\) .*got width 5.*"
        r"available here: torch, ref$",
    ):
        d.resolve("cuda", "cuda", width=5)
    with pytest.raises(RuntimeError, match="impl='cuda' cannot run on cpu: it needs CUDA tensors; available here: "):
        d.resolve("cuda", "cpu")


def test_the_reason_reads_as_a_sentence_for_the_toy():
    d = _toy()
    with pytest.raises(RuntimeError, match=r"^toy_op: impl='fast' needs a GPU; available here: chunked, ref$"):
        d.resolve("fast", "cpu")
    assert d.unavailable_reason("fast", "cpu") == "needs a GPU" and d.unavailable_reason("fast", "cuda") is None


def test_tensors_without_data_accept_the_kernels_marked_dataless():
    d = Dispatcher("toy", [Impl("gpu", runs=lambda device: False, dataless=True), Impl("ref")], register=False)
    assert d.resolve("gpu", "cpu", dataless=True) == "gpu"
    with pytest.raises(RuntimeError, match="impl='gpu' cannot run on cpu"):
        d.resolve("gpu", "cpu")
    with pytest.raises(RuntimeError):
        _toy().resolve("fast", "cpu", dataless=True)  # not marked: checked as usual


# --------------------------------------------------------------------------------------------
# auto, determinism
# --------------------------------------------------------------------------------------------


def test_auto_is_the_first_that_runs_and_is_allowed():
    d = _toy()
    assert d.auto_impl("cuda", deterministic=False) == "fast"
    assert d.auto_impl("cuda", deterministic=True) == "chunked"
    assert d.auto_impl("cpu") == "chunked"
    never = Dispatcher("toy", [Impl("ref", auto=False)], register=False)
    assert never.auto_impl("cpu") == "ref"  # the last one, when none is allowed
    ruled = _toy(auto=lambda d, device, deterministic, **context: "ref" if context.get("tiny") else "chunked")
    assert ruled.auto_impl("cpu", tiny=True) == "ref" and ruled.resolve("auto", "cpu") == "chunked"


def test_deterministic_mode_refuses_a_named_non_deterministic_impl(deterministic):
    d = _toy()
    assert d.auto_impl("cuda") == "chunked"
    with pytest.raises(
        RuntimeError,
        match=r"^toy_op: impl='fast' has a non-deterministic backward \(atomic additions\)"
        r".*'chunked', 'ref'",
    ):
        d.resolve("fast", "cuda")


def test_warn_only_mode_warns_and_goes_on():
    d = _toy()
    before, warn_only = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with pytest.warns(UserWarning, match="impl='fast' has a non-deterministic backward"):
            assert d.resolve("fast", "cuda") == "fast"
    finally:
        torch.use_deterministic_algorithms(before, warn_only=warn_only)


def test_every_dispatcher_keeps_auto_deterministic_in_deterministic_mode(deterministic):
    for d in _dispatchers():
        for device in ("cpu", "cuda", "meta"):
            assert d.deterministic_backward[d.auto_impl(device)], (d.op, device)


# --------------------------------------------------------------------------------------------
# Defaults
# --------------------------------------------------------------------------------------------


def test_set_default_impl_returns_the_previous_and_default_impl_restores():
    for d in _dispatchers():
        assert d.default == "auto"
        previous = d.set_default_impl(d.reference)
        try:
            assert previous == "auto" and d.resolve(None, "cpu") == d.reference
            assert d.resolve("auto", "cpu") == d.auto_impl("cpu")  # an explicit impl wins over the default
        finally:
            assert d.set_default_impl(previous) == d.reference
        with pytest.raises(KeyError):
            with d.default_impl(d.reference):
                assert d.default == d.reference
                raise KeyError("restored even so")
        assert d.default == "auto"


def test_the_defaults_reach_the_ops():
    x, w = torch.randn(1, 2, 5), torch.randn(2, 3)
    used.reset()
    with conv.default_impl("ref"):
        conv.causal_conv1d(x, w)
    conv.causal_conv1d(x, w)
    assert used.calls()["causal_conv1d"] == {"ref": 1, conv.auto_impl("cpu"): 1}
    used.reset()
    with dispatcher("vandermonde_kernel").default_impl("chunked"):
        ssm_kernels.vandermonde_kernel(
            torch.randn(2, 3, dtype=torch.complex64), torch.randn(2, 3, dtype=torch.complex64), 4
        )
    assert used.kernels() == {"vandermonde": "chunked"}


# --------------------------------------------------------------------------------------------
# longrange check and longrange info list every registered op
# --------------------------------------------------------------------------------------------


def test_check_quick_lists_every_registered_op(capsys):
    code = main(["check", "--quick", "--device", "cpu", "--dtype", "float32"])
    out = capsys.readouterr().out
    table, _, rest = out.partition("\n\n")
    ops = {line.split("  ")[0].strip() for line in table.splitlines()[2:]}
    for op, d in DISPATCHERS.items():
        assert d.function in ops or f"{op} " in rest, op
    assert code == 0 and "FAIL" not in out
    # The ops of this package's families have a check case for every implementation that runs here.
    assert [m for m in check.unchecked(["cpu"]) if m[0] in CORE] == []
    for op in CORE:
        assert dispatcher(op).function in ops


def test_unchecked_names_a_registered_implementation_without_a_case(monkeypatch):
    monkeypatch.setattr(check, "FAMILIES", [])
    missing = check.unchecked(["cpu"])
    for op in CORE:
        d = dispatcher(op)
        assert {(op, impl, "cpu") for impl in d.available_impls("cpu") if impl != d.reference} <= set(missing)


def test_info_lists_every_registered_op():
    table = info_table()
    text = format_info(table)
    for device in table["dispatch"]:
        assert set(DISPATCHERS) <= set(table["dispatch"][device])
        assert set(table["implementations"][device]) == set(DISPATCHERS)
        for op, st in table["implementations"][device].items():
            d = DISPATCHERS[op]
            assert st["available"] == list(d.available_impls(device)) and st["auto"] == d.auto_impl(device)
            if d.describe_auto is not None:  # a rule that depends on the inputs, in the op's words
                assert table["dispatch"][device][op] == d.describe_auto(torch.device(device))
            else:
                assert table["dispatch"][device][op].split(" ")[0].rstrip(",") == st["auto"]
    for op in DISPATCHERS:
        assert f"\n{op} " in text


def test_no_warning_from_the_verbs():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for d in _dispatchers():
            d.available_impls("cpu"), d.deterministic_impls("cuda"), d.auto_impl("meta")


def test_holds_data_is_false_on_meta_and_for_fake_tensors_only():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from longrange.ops.dataless import holds_data

    x = torch.randn(2, 3)
    assert holds_data(x) and holds_data(torch.nn.Parameter(x)) and holds_data(x[:, 1:])
    assert not holds_data(torch.empty(2, 3, device="meta"))
    assert not holds_data(torch.nn.Parameter(torch.empty(2, 3, device="meta")))
    with FakeTensorMode() as mode:
        fake = torch.randn(2, 3)
    assert not holds_data(fake) and not holds_data(mode.from_tensor(x))
