"""The manifest (``ascend_cache.json``): what a cache was built for, its files and block packages.

Every key of `KEY_FIELDS` must equal the running process for the artifacts to be used; a manifest
that is not exactly what `save_ascend_cache` writes is a `ValueError` naming the problem.
"""

from __future__ import annotations

import hashlib
import platform as host
import re
import sys
from typing import Any

import torch

from .packages import CallSignature, parse_outputs, parse_state

MANIFEST_NAME = "ascend_cache.json"
ARTIFACTS_NAME = "ascend_inductor_cache.bin"
KERNELS_NAME = "ascend_cpp_kernels.tar"
FORMAT = 2
MECHANISM = "inductor-mega-cache+aoti-blocks"
# executor="eager": block packages only, each the fused graph as torch.export's program JSON (`eager.py`).
EAGER_MECHANISM = "eager-export-blocks"
PACKAGE_NAME = re.compile(r"^(ascend_aoti_[0-9]{1,4}\.pt2|ascend_export_[0-9]{1,4}\.json)$")
# The package file names of each mechanism.
_PACKAGE_NAMES = {
    MECHANISM: (re.compile(r"^ascend_aoti_[0-9]{1,4}\.pt2$"), "ascend_aoti_<n>.pt2"),
    EAGER_MECHANISM: (re.compile(r"^ascend_export_[0-9]{1,4}\.json$"), "ascend_export_<n>.json"),
}
# Manifest key -> its meaning, as a mismatch warning names it.
KEY_FIELDS = {
    "torch": "torch version",
    "platform": "platform",
    "machine": "machine architecture",
    "device": "device capability (AOTInductor packages hold code for it)",
    "python": "Python version",
    "diffusers_ascend": "diffusers-ascend version",
    "config_hash": "AscendConfig.cache_key()",
    "pass_hash": "fusion pass source hash (FusionPassManager.uuid())",
    "executor": "executor",
}
_MANIFEST_KEYS = {"format", "mechanism", "files", "blocks", *KEY_FIELDS}
_BLOCK_KEYS = {"model", "class", "file", "signature", "state", "outputs", "matches", "ops_before", "ops_after"}
_SHA = re.compile(r"^[0-9a-f]{64}$")
# Far above any real file (a block package of a real DiT is megabytes): bounds what a manifest may claim.
MAX_ARTIFACT_BYTES = 1 << 40


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def new_manifest(mechanism: str, keys: dict[str, str], blobs: dict[str, bytes], blocks: list) -> dict[str, Any]:
    """The manifest of a save: its mechanism, the setup `keys`, every file's sha256 and size, its blocks."""
    return {
        "format": FORMAT,
        "mechanism": mechanism,
        **keys,
        "files": {name: {"sha256": sha256(data), "size": len(data)} for name, data in blobs.items()},
        "blocks": blocks,
    }


def expected_keys(cfg) -> dict[str, str]:
    """The manifest keys the running process produces for `cfg` (an `AscendConfig`).

    >>> from diffusers_ascend.config import AscendConfig
    >>> sorted(expected_keys(AscendConfig(executor="inductor")))[:3]
    ['config_hash', 'device', 'diffusers_ascend']
    """
    from .. import __version__
    from ..compilation.passes import ordered_fusions
    from ..compilation.passes.manager import FusionPassManager
    from ..platform import current_platform, device_capability

    plat = current_platform()
    return {
        "torch": torch.__version__,
        "platform": plat,
        "machine": host.machine(),
        "device": device_capability(plat),
        "python": "{}.{}".format(*sys.version_info[:2]),
        "diffusers_ascend": __version__,
        "config_hash": cfg.cache_key(),
        "pass_hash": FusionPassManager(ordered_fusions(cfg.resolved_fusions(plat))).uuid(),
        "executor": cfg.resolved_executor(plat),
    }


def read_manifest(path: str) -> dict[str, Any]:
    """The manifest at `path`, checked to be exactly what `save_ascend_cache` writes.

    A manifest of format 1 (no block packages) is returned as ``{"format", "diffusers_ascend"}``
    for `mismatches` to report; nothing of it is loaded.

    Raises:
        ValueError: not a JSON object of the expected keys and types (names the problem).
    """
    from ..config import read_json_object

    data = read_json_object(path, what="an ascend cache manifest")
    where = f"{path} is not a valid {MANIFEST_NAME} (tampered or corrupt?)"
    if data.get("format") == 1 and isinstance(data.get("diffusers_ascend"), str):
        return {"format": 1, "diffusers_ascend": data["diffusers_ascend"]}
    if set(data) != _MANIFEST_KEYS:
        missing, extra = sorted(_MANIFEST_KEYS - set(data)), sorted(set(data) - _MANIFEST_KEYS)
        raise ValueError(f"{where}: missing keys {missing}, unknown keys {extra}")
    if data["format"] != FORMAT or data["mechanism"] not in _PACKAGE_NAMES:
        raise ValueError(
            f"{where}: format {data['format']!r} / mechanism {data['mechanism']!r}; "
            f"this diffusers-ascend reads format {FORMAT} / {' or '.join(map(repr, _PACKAGE_NAMES))}"
        )
    eager = data["mechanism"] == EAGER_MECHANISM
    if eager and data["executor"] != "eager":
        raise ValueError(f"{where}: mechanism {data['mechanism']!r} with executor {data['executor']!r}")
    for key in KEY_FIELDS:
        if not isinstance(data[key], str):
            raise ValueError(f"{where}: {key!r} must be a string, got {type(data[key]).__name__}")
    files, blocks = data["files"], data["blocks"]
    if not isinstance(blocks, list):
        raise ValueError(f"{where}: 'blocks' must be a list")
    for i, block in enumerate(blocks):
        _check_block_entry(block, _PACKAGE_NAMES[data["mechanism"]], where=f"{where}: blocks[{i}]")
    packages = {b["file"] for b in blocks}
    if eager:  # the packages alone: the eager executor leaves nothing in torch's caches
        if not isinstance(files, dict) or set(files) != packages or len(packages) != len(blocks) or not blocks:
            raise ValueError(f"{where}: 'files' must name each block's package exactly once, and nothing else")
    elif (
        not isinstance(files, dict)
        or ARTIFACTS_NAME not in files
        or not set(files) <= {ARTIFACTS_NAME, KERNELS_NAME} | packages
        or not packages <= set(files)
        or len(packages) != len(blocks)
    ):
        raise ValueError(
            f"{where}: 'files' must name {ARTIFACTS_NAME!r}, optionally {KERNELS_NAME!r}, and each "
            "block's package exactly once"
        )
    for name, entry in files.items():
        if (
            not isinstance(entry, dict)
            or set(entry) != {"sha256", "size"}
            or not isinstance(entry["sha256"], str)
            or not _SHA.match(entry["sha256"])
            or type(entry["size"]) is not int
            or not 0 <= entry["size"] <= MAX_ARTIFACT_BYTES
        ):
            raise ValueError(
                f"{where}: files[{name!r}] must be {{'sha256': <64 hex digits>, 'size': <bytes, at most "
                f"{MAX_ARTIFACT_BYTES}>}}"
            )
    return data


def _check_block_entry(block: Any, package_name: tuple[re.Pattern, str], where: str) -> None:
    """A ``blocks`` entry: the keys `build_packages` writes, each of its type; the signature, state
    and output spec are parsed as data."""
    if not isinstance(block, dict) or set(block) != _BLOCK_KEYS:
        raise ValueError(f"{where} must have exactly the keys {sorted(_BLOCK_KEYS)}")
    if not all(isinstance(block[k], str) for k in ("model", "class", "file", "outputs")):
        raise ValueError(f"{where}: 'model', 'class', 'file' and 'outputs' must be strings")
    if not package_name[0].match(block["file"]):
        raise ValueError(f"{where}: package file {block['file']!r} is not named {package_name[1]}")
    matches = block["matches"]
    if not isinstance(matches, dict) or not all(
        isinstance(k, str) and type(v) is int and v >= 0 for k, v in matches.items()
    ):
        raise ValueError(f"{where}: 'matches' must map fusion names to counts")
    if not all(type(block[k]) is int and block[k] >= 0 for k in ("ops_before", "ops_after")):
        raise ValueError(f"{where}: 'ops_before' and 'ops_after' must be counts")
    try:
        CallSignature.from_json(block["signature"])
        parse_state(block["state"])
        parse_outputs(block["outputs"])
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def mismatches(manifest: dict[str, Any], cfg) -> list[str]:
    """``"<meaning>: saved X, here Y"`` for each key of `manifest` that differs from this process."""
    if manifest.get("format") != FORMAT:
        return [
            f"manifest format: saved {manifest.get('format')!r} by diffusers-ascend "
            f"{manifest.get('diffusers_ascend')!r}, here {FORMAT}"
        ]
    here = expected_keys(cfg)
    diffs = [f"{KEY_FIELDS[k]}: saved {manifest[k]!r}, here {here[k]!r}" for k in KEY_FIELDS if manifest[k] != here[k]]
    if (manifest["mechanism"] == EAGER_MECHANISM) != (here["executor"] == "eager"):
        diffs.append(f"mechanism: saved {manifest['mechanism']!r}, which executor={here['executor']!r} does not run")
    return diffs
