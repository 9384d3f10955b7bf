"""Autograd shared by the ops: a separate ``<op>_backward`` custom op per op.

Its real impl is `torch.func.vjp` of the op's native composite, so the gradient is the reference's
by construction and aot_autograd traces the backward as one opaque, fake-able call. Annotated
``-> List[torch.Tensor]``: torch 2.6's schema inference knows neither ``list[Tensor]`` nor an alias.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, List

import torch

__all__ = ["vjp_grads", "fake_grads", "register_vjp_autograd"]


def _tensor_positions(args: Sequence) -> list[int]:
    return [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]


def vjp_grads(native: Callable[..., Any], args: Sequence, grad: torch.Tensor | tuple) -> List[torch.Tensor]:
    """Gradients of ``native(*args)`` w.r.t. each tensor argument (``None`` skipped), in order.

    ``grad``: the output's gradient, or a tuple of one per output for an op returning several.

    Each gradient is written into a fresh ``empty_like`` of its input: same dtype and strides as
    `fake_grads` promises, and never an alias of ``grad`` (a custom op must not return aliases).
    """
    pos = _tensor_positions(args)

    def f(*tensors):
        full = list(args)
        for i, t in zip(pos, tensors):
            full[i] = t
        return native(*full)

    primals = [args[i] for i in pos]
    _, vjp_fn = torch.func.vjp(f, *primals)
    grads = vjp_fn(grad)
    out = []
    for p, g in zip(primals, grads):
        buf = torch.empty_like(p)
        buf.copy_(g)
        out.append(buf)
    return out


def fake_grads(args: Sequence) -> List[torch.Tensor]:
    """Fake impl of a backward op: one ``empty_like`` per tensor argument."""
    return [torch.empty_like(a) for a in args if isinstance(a, torch.Tensor)]


def register_vjp_autograd(op, backward_op) -> None:
    """Registers autograd for ``op`` whose backward is ``backward_op(*grads, *op_args) -> list[Tensor]``.

    ``grads``: one per output of ``op`` (an op returning a tuple gets one per element; autograd
    passes zeros for an output that was not used). ``backward_op`` returns one gradient per tensor
    argument of the call (``None`` arguments skipped).
    """

    def setup_context(ctx, inputs, output):
        pos = _tensor_positions(inputs)
        ctx.tensor_pos = pos
        ctx.n_inputs = len(inputs)
        ctx.other_args = [None if i in pos else a for i, a in enumerate(inputs)]
        ctx.save_for_backward(*[inputs[i] for i in pos])

    def backward(ctx, *output_grads):
        args = list(ctx.other_args)
        for i, t in zip(ctx.tensor_pos, ctx.saved_tensors):
            args[i] = t
        grads = backward_op(*output_grads, *args)
        result = [None] * ctx.n_inputs
        for i, g in zip(ctx.tensor_pos, grads):
            if ctx.needs_input_grad[i]:
                result[i] = g
        return tuple(result)

    op.register_autograd(backward, setup_context=setup_context)
