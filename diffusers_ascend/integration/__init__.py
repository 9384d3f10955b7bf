"""How diffusers-ascend attaches to diffusers pipelines and models, one job per module:

- `api`: the entry points `enable_ascend_compile`, `disable_ascend_compile`, `ascend_report`,
  `save_ascend_cache`, `package_counters` (enable is all-or-nothing).
- `views`: `enabled_models`, read-only `EnabledModelInfo` views of that record for tools.
- `block_compile`: each block compiled in place through its config's own code object, per-block fallback.
- `limits`: holds on dynamo's process-wide recompile limit.
- `diagnostics`: what keeps a model from running as configured, recorded once with a warning.
- `patching`: the methods added to diffusers' classes and the ``from_pretrained`` wrapper.
- `models`: which models of a pipeline enabling acts on.

Attention setup lives beside the attention backends (`diffusers_ascend.attention.setup`); `EnabledModel`, the
one record of what enabling set up on a model, below this package and warm start (`diffusers_ascend.enabled`).
"""

from ..enabled import ASCEND_CONFIG_KEY, EnabledModel
from .api import ascend_report, disable_ascend_compile, enable_ascend_compile, package_counters, save_ascend_cache
from .patching import AscendAccelerationMixin, patch_class
from .views import EnabledModelInfo, enabled_models

__all__ = [
    "ASCEND_CONFIG_KEY",
    "AscendAccelerationMixin",
    "EnabledModel",
    "EnabledModelInfo",
    "ascend_report",
    "disable_ascend_compile",
    "enable_ascend_compile",
    "enabled_models",
    "package_counters",
    "patch_class",
    "save_ascend_cache",
]
