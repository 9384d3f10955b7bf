"""The one record of an enabled model: what `enable_ascend_compile` set up on it (``model._ascend_state``),
what `disable_ascend_compile` undoes, and what warm start reads and fills.

Data only, no behaviour, on the floor below everything that reads it (`attention.setup`, `warm_start`,
`integration`; tests/test_architecture.py): outside `diffusers_ascend.integration`, because importing
any module of a package runs that package's ``__init__`` first, and warm start never imports the enable path.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # the record holds them; importing compilation here would make `import diffusers` heavy
    from .compilation.report import Fallback

# The key under which a model's config and a pipeline's ``model_index.json`` carry the `AscendConfig`.
ASCEND_CONFIG_KEY = "_ascend_config"


@dataclasses.dataclass(eq=False)  # identity-hashed: the recompile-limit holds are keyed by record
class EnabledModel:
    """What enabling set up on one model; stored as ``model._ascend_state``. Recorded before the
    model changes, so a failure half-way is undone from it. Public, read-only views of it:
    `diffusers_ascend.integration.enabled_models`."""

    config: Any  # AscendConfig
    backend: Any  # AscendBackend; None under compile="none"
    model_class: str = ""  # the model's class name (for messages)
    compiled: list[torch.nn.Module] = dataclasses.field(default_factory=list)  # the modules compiled in place
    fallbacks: list[Fallback] = dataclasses.field(default_factory=list)
    attention: dict[Any, Any] | None = None  # processor -> its previous _attention_backend
    # npu_fia's forward hooks (`attention.npu_fia.track`)
    attention_hooks: list[Any] = dataclasses.field(default_factory=list)
    # (object, original class), see layers.apply_swaps
    swapped: list[tuple[object, type]] = dataclasses.field(default_factory=list)
    swaps: dict[str, int] = dataclasses.field(default_factory=dict)
    shared: list[tuple[Any, Any, Any]] = dataclasses.field(default_factory=list)  # see processors.share_processors
    # Warm start: per block class, the signature of each inference call that compiled a graph
    # (`save_ascend_cache` packages them), and the packages loaded (`install_packages`).
    record_signatures: bool = False
    # block class name -> [(CallSignature, weakref to a block of the class)]
    signatures: dict[str, list[tuple[Any, Any]]] = dataclasses.field(default_factory=dict)
    aot_blocks: dict[str, list[Any]] = dataclasses.field(default_factory=dict)  # class name -> [AotBlock]
    compiled_call: Any = None  # the `block_compile.CompiledCall` that compiles this config's modules
    packages_passed_on: int = 0  # calls of a packaged class that no package took
    # Whether the model ran (`diagnostics.RunMarker`, a hook on it) and whether a module's compiled
    # call ran: a model that ran while none did was traced by another torch.compile around it.
    marker: Any = None
    compiled_ran: bool = False

    def __getstate__(self) -> dict[str, Any]:
        # A pickled model keeps its config, swaps and attention backends; like torch's in-place
        # `Module.compile()`, compilation does not travel (blocks run uncompiled until enabled again).
        state = dict(self.__dict__)
        state.update(backend=None, compiled=[], signatures={}, aot_blocks={}, compiled_call=None)
        return state


def state_of(model: torch.nn.Module) -> EnabledModel | None:
    """The record of `model` if it is enabled, else None."""
    return getattr(model, "_ascend_state", None)
