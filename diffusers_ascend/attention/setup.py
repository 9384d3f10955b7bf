"""Setting an enabled model's attention backend, per processor (recorded, so disable restores it),
and reporting the ``npu_fia`` calls that fell back."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .. import _diffusers_compat as dc
from . import NPU_FIA, backend_for, processors

if TYPE_CHECKING:
    from ..enabled import EnabledModel


def runs_ring(model: torch.nn.Module) -> bool:
    """Whether diffusers' context parallelism runs ring attention in ``model`` (``enable_parallelism``
    with ``ring_degree > 1``): ring merges partial results with the log-sum-exp."""
    for p in processors(model):
        cp = getattr(dc.parallel_config(p), "context_parallel_config", None)
        if cp is not None and (getattr(cp, "ring_degree", None) or 1) > 1:
            return True
    return False


def set_attention(model: torch.nn.Module, cfg, record: EnabledModel) -> None:
    """Sets the resolved attention backend on `model`'s attention processors, recorded first in
    ``record.attention`` (processor -> previous backend) and ``record.attention_hooks`` (npu_fia's
    fallback log), so `restore_attention` undoes it. Not through ``model.set_attention_backend``:
    that also sets diffusers' process-wide active backend, which every other model without a
    backend of its own would use."""
    from .npu_fia import track

    if not hasattr(model, "set_attention_backend"):
        return
    backend = cfg.resolved_attention(ring=runs_ring(model), dtype=getattr(model, "dtype", None))
    if backend is None:
        return
    member = backend_for(backend)
    if backend == NPU_FIA:
        from ascend_kernels.npu import torch_npu_available

        if not torch_npu_available():  # as diffusers refuses "_native_npu" here
            raise RuntimeError(
                f"attention={backend!r} needs torch_npu, which is not installed; install torch_npu on "
                "an Ascend host, or use attention='auto' or a diffusers backend (e.g. 'native')."
            )
    else:  # diffusers' own checks of set_attention_backend (package installed, kernel)
        dc.check_backend_requirements(member)
    procs = processors(model)
    if any(dc.parallel_config(p) is not None for p in procs) and not dc.supports_context_parallel(member):
        raise ValueError(
            f"attention={backend!r} does not support diffusers' context parallelism, which this model runs; "
            f"valid: {dc.context_parallel_backends()}."
        )
    record.attention = {p: dc.attention_backend(p) for p in procs}
    for p in procs:
        dc.set_attention_backend(p, member)
    if backend == NPU_FIA:
        record.attention_hooks = track(model)  # its own fallback log, for its report


def restore_attention(record: EnabledModel) -> None:
    """Undoes `set_attention`: each processor's previous backend, npu_fia's hooks removed."""
    if record.attention is not None:
        for proc, prev in record.attention.items():
            dc.set_attention_backend(proc, prev)
    for hook in getattr(record, "attention_hooks", ()):  # a record pickled before this field has none
        hook.remove()


def report_attention(model: torch.nn.Module, record: EnabledModel, rep) -> None:
    """Adds to `rep` `model`'s own ``npu_fia`` calls that FIA could not take (reason and path), since enable."""
    from .npu_fia import model_fallbacks

    if not getattr(record, "attention_hooks", None):
        return
    for reason, calls in model_fallbacks(model).items():
        rep.add_fallback(f"attention ({NPU_FIA})", f"{calls} call(s) fell back: {reason}")
