"""Tensors that hold no data: the ``meta`` device and fake tensors (``FakeTensorMode``).

Dry runs and memory planning build models and take training steps on such tensors: every shape,
dtype and device is as in a real run, no value exists. Code that reads a value on the host (a
range check of token ids or labels, a choice made from a mask) asks :func:`holds_data` first and,
on a tensor without data, skips the check or takes the choice that every batch of longrange's own
makes (documented where it does so). :class:`DtypeChecks` adds the dtype checks that the meta
device's shape functions leave out and CUDA's kernels make.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

#: Tensor types that always hold data off the meta device (a fake tensor is a subclass).
_PLAIN = (Tensor, torch.nn.Parameter)


def holds_data(t: Tensor) -> bool:
    """Whether the values of ``t`` can be read: False on the ``meta`` device and for fake tensors.

    Under ``torch.compile`` it is True: compiled code reads values where eager code does (the
    tensors it traces are fake, those it runs on are not).
    """
    if type(t) in _PLAIN and t.device.type != "meta":  # the common case first: 0.5 µs, the checks below 3
        return True
    if torch.compiler.is_compiling():
        return True
    if t.device.type == "meta":
        return False
    from torch._subclasses.fake_tensor import is_fake

    return not is_fake(t)


def fake_mode():
    """A ``FakeTensorMode`` in which a selection by value (``nonzero``, and what PyTorch builds on it:
    boolean indexing, ``masked_select``) selects every element: the shape has no other value without
    data, and it is the bound of the memory and work of what follows."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    class DatalessMode(FakeTensorMode):
        def dispatch(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.nonzero.default:
                (arg,) = args
                return super().dispatch(torch.ops.aten.nonzero_static.default, types, (arg,), {"size": arg.numel()})
            if func is torch.ops.aten.masked_select.default:
                x, mask = args
                return x.new_empty(torch.Size(torch.broadcast_shapes(x.shape, mask.shape)).numel())
            return super().dispatch(func, types, args, kwargs)

    # Real tensors met inside (constants made on meta by ``torch.tensor``) are taken as fake ones on their device.
    return DatalessMode(allow_non_fake_inputs=True)


#: Operations whose floating-point operands must share one dtype on CUDA (and on the CPU), which
#: the meta device's shape functions do not check: matrix products, convolutions, attention, and
#: writes of one tensor's values into another by index.
SAME_DTYPE_OPS = frozenset(
    getattr(torch.ops.aten, name)
    for name in (
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "addbmm",
        "mv",
        "addmv",
        "dot",
        "vdot",
        "convolution",
        "_convolution",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "index_put",
        "index_put_",
        "_index_put_impl_",
        "scatter",
        "scatter_",
        "scatter_add",
        "scatter_add_",
        "masked_scatter",
        "masked_scatter_",
    )
    if hasattr(torch.ops.aten, name)
)


class DtypeChecks(TorchDispatchMode):
    """Refuses, as CUDA kernels do, an operation of :data:`SAME_DTYPE_OPS` whose floating-point tensor
    operands differ in dtype (the meta device and fake tensors let them through)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func._overloadpacket in SAME_DTYPE_OPS:
            dtypes = {
                t.dtype
                for t in tree_flatten((args, kwargs))[0]
                if isinstance(t, Tensor) and (t.is_floating_point() or t.is_complex())
            }
            if len(dtypes) > 1:
                names = " and ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))
                raise RuntimeError(
                    f"{func}: operands of different dtypes ({names}); CUDA and CPU kernels refuse them "
                    "(expected all operands to have the same dtype)"
                )
        return func(*args, **kwargs)
