"""Read-only views of what enabling set up, for tools (the CLI, benchmarks, services) that must not
depend on the private record on each model."""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from ..enabled import state_of
from .models import models_of

if TYPE_CHECKING:
    from diffusers import DiffusionPipeline, ModelMixin

    from ..config import AscendConfig


@dataclasses.dataclass(frozen=True)
class EnabledModelInfo:
    """One enabled model, as `enabled_models` saw it (a snapshot: enabling again makes new ones).

    Attributes:
        name: its component name in the pipeline (``""`` for a model enabled alone).
        model: the model (without a ``torch.compile`` wrapper).
        config: the `AscendConfig` it was enabled with.
        executor: what runs its rewritten graphs (``"eager"`` or ``"inductor"``); None under
            ``compile="none"``.
        compiled: the modules compiled in place (the blocks, or the model under ``compile="model"``),
            including any that fell back to eager since.
        block_classes: the class names of `compiled`, each once, in order.
        signatures: block class name -> the call signatures recorded for `save_ascend_cache`.
        packages: block class name -> the warm-start packages loaded for it.
        captured_graphs: the device graphs captured so far; None without ``graph_capture``.
        capture_stats: the graph-capture counters (captures, replays, ...); None without ``graph_capture``.
    """

    name: str
    model: torch.nn.Module = dataclasses.field(repr=False)
    config: AscendConfig
    executor: str | None
    compiled: tuple[torch.nn.Module, ...] = dataclasses.field(repr=False)
    block_classes: tuple[str, ...]
    signatures: Mapping[str, int]
    packages: Mapping[str, int]
    captured_graphs: int | None
    capture_stats: Mapping[str, int] | None


def enabled_models(pipe_or_model: DiffusionPipeline | ModelMixin) -> list[EnabledModelInfo]:
    """The enabled models of a pipeline or model, each as a read-only `EnabledModelInfo`.

    Args:
        pipe_or_model: a `DiffusionPipeline` or a diffusers `ModelMixin`.

    Returns:
        One `EnabledModelInfo` per enabled model, in component order; empty if none is enabled.

    >>> import diffusers_ascend
    >>> from diffusers_ascend.integration import enabled_models
    >>> from diffusers_ascend.tiny import tiny_flux_transformer
    >>> model = diffusers_ascend.enable_ascend_compile(tiny_flux_transformer(), executor="eager")
    >>> info, = enabled_models(model)
    >>> info.config.executor, info.executor, info.block_classes
    ('eager', 'eager', ('FluxTransformerBlock', 'FluxSingleTransformerBlock'))
    >>> enabled_models(diffusers_ascend.disable_ascend_compile(model))
    []
    """
    out = []
    for name, model in models_of(pipe_or_model):
        state = state_of(model)
        if state is None:
            continue
        backend = state.backend
        capture = backend.graph_capture if backend is not None else None
        out.append(
            EnabledModelInfo(
                name=name,
                model=model,
                config=state.config,
                executor=backend.executor if backend is not None else None,
                compiled=tuple(state.compiled),
                block_classes=tuple(dict.fromkeys(type(m).__name__ for m in state.compiled)),
                signatures=types.MappingProxyType({k: len(v) for k, v in state.signatures.items()}),
                packages=types.MappingProxyType({k: len(v) for k, v in state.aot_blocks.items()}),
                captured_graphs=capture.num_graphs if capture is not None else None,
                capture_stats=types.MappingProxyType(dict(capture.stats)) if capture is not None else None,
            )
        )
    return out
