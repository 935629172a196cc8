"""The model compiled with ``torch.compile`` (``train.compile: true``): the trainer's component.

    compilation = Compilation(cfg.compile, device)
    compilation.apply(model)       # in place; every call of the model runs compiled from now on
    ...
    compilation.restore(model)     # eager again (the trainer does this when fit ends)

    compile_model(model, device, fullgraph=True)   # the same, outside the trainer

What is compiled: the model's forward (``nn.Module.compile``, in place), and with it, by
AOTAutograd, its backward. Dynamo traces each mode the model runs in (training, evaluation
without gradients) into a graph, guarded by the shapes and settings it saw; a second length makes
the length dimension symbolic (PyTorch's automatic dynamic shapes), so padded batches of varying
length compile twice, not once per length. Inductor fuses the elementwise operations between the
matrix products, convolutions and fused kernels (each fused kernel is one opaque registered
operator in the graph, forward and backward: ``ops/custom_ops.py``). The first steps of a run
(and its first evaluation) take the compilation's time; the compiled code is cached on disk by
Inductor, so later runs of the same model start sooner.

In place, not ``torch.compile(model)``: that wraps the model in a module whose state-dict keys
start with ``_orig_mod.``; compiled in place, the model is the same module with the same
parameters, so checkpoints, the best weights, finetuning and resuming see the keys of an eager
run. ``train.compile`` is part of a run's identity (a compiled run's results differ from an eager
run's in the last float bits): a run resumes with the setting it started with.

The objective (loss and metrics) runs eagerly around the compiled model. Compiled with the model,
the pretraining objectives (next-token and masked prediction, whose masking and token-level losses
Inductor can fuse) made the demo models' pretraining steps 0.92-1.10 times as fast as the compiled
model alone, no consistent gain (``benchmarks/results/compile.pretrain.*``; their
selection of positions by value, ``pred[where]``, also splits such a step into two graphs); the
supervised objectives' losses over (batch, classes) cost little.

Random numbers (dropout) are drawn as in eager mode (Inductor's ``fallback_random``), so a compiled
step equals the eager step to float rounding, dropout included.

On the CPU, float32 matrix products in the compiled graphs run through oneDNN
(:class:`RouteMatmuls`, :func:`longrange.ops.matmul.mm_onednn`), where PyTorch has oneDNN: on
CPUs whose maker MKL does not recognise (AMD's) its products ran 2.3-2.4 times as fast as MKL's,
1.25 times with a transposed first operand (``benchmarks/results/compile.mamba_py.*``).

``fullgraph``: the trainer compiles with ``fullgraph=False`` (a graph break in a user's plugin
primitive splits the graph rather than stopping the run); every built-in block and primitive
compiles in one graph (``fullgraph=True``, tested in ``tests/train/test_compile.py``).

On the CPU, Inductor builds its kernels as C++ with command lines that hold PyTorch's, Python's and
its cache's paths unquoted: where one of them has whitespace (a checkout or environment in a folder
such as ``My Projects``), the build cannot link, and ``train.compile`` on the CPU is a ConfigError
saying so before any step (:func:`cpp_build_blocker`) rather than a linker error at the first step.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from longrange.errors import ConfigError

__all__ = [
    "Compilation",
    "RouteMatmuls",
    "compile_model",
    "compile_options",
    "cpp_build_blocker",
    "is_compiled",
    "restore",
]


def _route_matmuls(graph: torch.fx.Graph) -> int:
    """Replace float32 CPU ``aten.mm`` and ``aten.addmm`` (with a bias vector) by oneDNN's product;
    returns how many were replaced."""
    aten = torch.ops.aten
    routed = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in (aten.mm.default, aten.addmm.default) or node.kwargs:
            continue
        if node.target is aten.mm.default:
            (a, b), bias = node.args, None
        else:
            bias, a, b = node.args
        values = [getattr(x, "meta", {}).get("val") for x in (a, b)] + (
            [bias.meta.get("val")] if bias is not None else []
        )
        if any(not isinstance(v, torch.Tensor) or v.device.type != "cpu" or v.dtype != torch.float32 for v in values):
            continue
        if bias is not None and tuple(values[2].shape) != (values[1].shape[1],):
            continue  # a bias matrix, not a vector per output column
        with graph.inserting_before(node):
            new = graph.call_function(torch.ops.longrange.mm_onednn.default, (a, b, bias))
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        routed += 1
    return routed


def _custom_graph_pass() -> type | None:
    try:
        from torch._inductor.custom_graph_pass import CustomGraphPass
    except ImportError:  # an older PyTorch: no cacheable custom passes
        return None
    return CustomGraphPass


class RouteMatmuls:
    """Inductor's post-gradient graph pass that runs float32 CPU matrix products through oneDNN
    (:func:`longrange.ops.matmul.mm_onednn`). Its ``uuid`` (the hash of this file and of
    ``ops/matmul.py``) keys Inductor's cache of compiled graphs."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        _route_matmuls(graph)

    def uuid(self) -> Any:
        from torch._inductor.custom_graph_pass import get_hash_for_files

        from longrange.ops import matmul

        return get_hash_for_files((__file__, matmul.__file__))


def _route_matmuls_pass() -> Any | None:
    """A :class:`RouteMatmuls` that Inductor accepts (a ``CustomGraphPass``), or None where this
    PyTorch has no oneDNN product or no such passes."""
    from longrange.ops.matmul import onednn_available

    base = _custom_graph_pass()
    if base is None or not onednn_available():
        return None
    cls = type("RouteMatmuls", (RouteMatmuls, base), {})
    return cls()


def compile_options(device: torch.device | str) -> dict[str, Any]:
    """Inductor's options for a model on ``device``: random numbers drawn as in eager mode
    (``fallback_random``), and on the CPU the oneDNN matrix products (:class:`RouteMatmuls`) where
    PyTorch has them."""
    options: dict[str, Any] = {"fallback_random": True}
    if torch.device(device).type == "cpu" and (route := _route_matmuls_pass()) is not None:
        options["post_grad_custom_post_pass"] = route
    return options


def build_paths() -> dict[str, str]:
    """The paths Inductor's C++ build passes to the compiler or linker, by what they are: PyTorch's
    own package (its headers and libraries), the environment's prefix, Python's headers and library
    directory, and Inductor's cache directory (where the generated code is built)."""
    import os
    import sys
    import sysconfig

    paths = {
        "PyTorch's package": os.path.dirname(torch.__file__),
        "the environment's prefix": sys.prefix,
        "Python's headers": sysconfig.get_path("include") or "",
        "Python's library directory": sysconfig.get_config_var("LIBDIR") or "",
    }
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        paths["Inductor's cache directory"] = cache_dir()
    except Exception:  # pragma: no cover - an older PyTorch keeps it elsewhere
        pass
    return paths


def cpp_build_blocker() -> str | None:
    """Why Inductor cannot build CPU code here, or None: the path of :func:`build_paths` with
    whitespace, which PyTorch writes into the command line unquoted (``-L/a b/torch/lib`` reaches
    ``ld`` as ``-L/a`` and ``b/torch/lib``: "ld: cannot find ...")."""
    for what, path in build_paths().items():
        if any(c.isspace() for c in str(path)):
            return (
                f"{what} {path!r} holds whitespace, which PyTorch Inductor's C++ build passes to the compiler "
                "and linker unquoted, so compiled CPU code cannot be built"
            )
    return None


def _check_supported(device: torch.device | str | None = None) -> None:
    import torch._dynamo

    if not torch._dynamo.is_dynamo_supported():  # e.g. a Python that this PyTorch's Dynamo does not support
        import sys

        raise ConfigError(
            f"train.compile: torch.compile is not supported with Python {sys.version.split()[0]} "
            f"and PyTorch {torch.__version__}; set train.compile false"
        )
    if device is not None and torch.device(device).type == "cpu" and (why := cpp_build_blocker()) is not None:
        raise ConfigError(
            f"train.compile on the CPU: {why}; set train.compile false, or install the environment "
            "(and TORCHINDUCTOR_CACHE_DIR) under a path without spaces"
        )


def compile_model(
    model: nn.Module, device: torch.device | str | None = None, *, fullgraph: bool = False, dynamic: bool | None = None
) -> nn.Module:
    """Compile ``model``'s forward in place (``nn.Module.compile``) with Inductor and the options of
    ``device`` (default: the device of its first parameter, else the CPU); returns the model."""
    if device is None:
        first = next(model.parameters(), None)
        device = first.device if first is not None else torch.device("cpu")
    _check_supported(device)
    model.compile(fullgraph=fullgraph, dynamic=dynamic, options=compile_options(device))
    return model


def is_compiled(model: nn.Module) -> bool:
    """Whether ``model``'s calls run compiled (:func:`compile_model`, ``nn.Module.compile``)."""
    return getattr(model, "_compiled_call_impl", None) is not None


def restore(model: nn.Module) -> None:
    """Make ``model``'s calls run eagerly again (undoes :func:`compile_model`)."""
    if is_compiled(model):
        model._compiled_call_impl = None


class Compilation:
    """The trainer's compilation: ``enabled`` (``train.compile``) compiles the model it is given
    on ``device`` in place; :meth:`restore` makes it eager again."""

    def __init__(self, enabled: bool, device: torch.device | str):
        self.enabled = bool(enabled)
        self.device = torch.device(device)
        if self.enabled:
            _check_supported(self.device)

    def apply(self, model: nn.Module) -> nn.Module:
        if self.enabled:
            compile_model(model, self.device)
        return model

    def restore(self, model: nn.Module) -> None:
        if self.enabled:
            restore(model)
