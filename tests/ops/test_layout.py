"""ops/layout.py: ``transposed`` swaps the last two dimensions with its result and its gradient laid
out as shaped."""

from __future__ import annotations

import pytest
import torch

from longrange.ops.layout import transposed


def test_the_result_and_its_gradient_are_contiguous_and_equal_to_the_view():
    x = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True)
    y = transposed(x)
    assert y.is_contiguous() and torch.equal(y, x.transpose(1, 2))
    seen = []
    x.register_hook(lambda g: seen.append(g))
    g = torch.randn(2, 3, 5, dtype=torch.float64)
    y.backward(g)
    assert seen[0].is_contiguous()  # a plain .contiguous() hands back a transposed view
    assert torch.equal(x.grad, g.transpose(1, 2))
    assert torch.autograd.gradcheck(transposed, (torch.randn(3, 4, dtype=torch.float64, requires_grad=True),))


def test_without_gradients_it_is_a_contiguous_copy():
    x = torch.randn(4, 6)
    y = transposed(x)
    assert y.is_contiguous() and torch.equal(y, x.T) and y.grad_fn is None


def test_a_tensor_of_one_dimension_is_an_error_naming_its_shape():
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        transposed(torch.randn(4))
