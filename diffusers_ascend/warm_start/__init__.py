"""Warm start: the compile results of an enabled model travel with it, like its `AscendConfig`.

`save_ascend_cache(obj, path)` writes, after at least one call of an enabled pipeline or model:

- ``ascend_cache.json``: the manifest (`manifest.py`): what the artifacts were built for, the
  sha256 of every file, one entry per block package.
- ``ascend_aoti_<n>.pt2`` (``compile="blocks"``): one AOTInductor package per compiled block class
  and call signature (`packages.py`), run by a warm process with no trace and no compile.
- ``ascend_inductor_cache.bin``: torch's portable compile cache, which serves every other call.
- ``ascend_cpp_kernels.tar`` (CPU only): the C++ kernels that cache leaves out (`kernels.py`).

Under ``executor="eager"`` (``compile="blocks"``) the cache holds the manifest and one
``ascend_export_<n>.json`` per compiled block class and call signature: the fused graph as
torch.export's program JSON, read back as data and run op by op (`eager.py`, its trust model there).

`enable_ascend_compile(obj, ..., cache=path_or_repo_id)` validates the manifest before it reads
any artifact: one made for another setup is a warning and a normal compile; one that is not what a
save writes, or a file whose sha256 differs, is a `ValueError` and nothing is loaded. Hub sources
need ``trust_remote_artifacts=True``. A save is all or nothing (`store.py`). The enable path hands
warm start its models' `EnabledModel` records (``diffusers_ascend.enabled``, a floor below
this package), by component name; warm start never reaches back into the enable path.
"""

from ..enabled import EnabledModel
from .load import (
    LoadedCache,
    LoadedPackage,
    TorchCaches,
    cache_info,
    count_packages,
    install_packages,
    load_ascend_cache,
)
from .manifest import (
    ARTIFACTS_NAME,
    EAGER_MECHANISM,
    FORMAT,
    KERNELS_NAME,
    MANIFEST_NAME,
    MECHANISM,
    expected_keys,
    mismatches,
    read_manifest,
)
from .packages import MISS, AotBlock, CallSignature, build_package, plain_call, record_signature
from .save import save_cache
from .store import pull_ascend_cache, push_ascend_cache, trusted_opt_in

__all__ = [
    "ARTIFACTS_NAME",
    "EAGER_MECHANISM",
    "FORMAT",
    "KERNELS_NAME",
    "MANIFEST_NAME",
    "MECHANISM",
    "MISS",
    "AotBlock",
    "CallSignature",
    "EnabledModel",
    "LoadedCache",
    "LoadedPackage",
    "TorchCaches",
    "build_package",
    "cache_info",
    "count_packages",
    "expected_keys",
    "install_packages",
    "load_ascend_cache",
    "mismatches",
    "plain_call",
    "pull_ascend_cache",
    "push_ascend_cache",
    "read_manifest",
    "record_signature",
    "save_cache",
    "trusted_opt_in",
]
