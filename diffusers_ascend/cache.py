"""Warm start: the compile results of an enabled model travel with it, like its `AscendConfig`.

`save_ascend_cache(obj, path)` writes, after at least one call of an enabled pipeline or model:

- ``ascend_cache.json``: the manifest. What the artifacts were built for (torch version,
  platform, machine, device capability, Python, diffusers-ascend version,
  `AscendConfig.cache_key()`, the pass source hash `FusionPassManager.uuid()`, the executor),
  the sha256 of every artifact file, and one entry per block package.
- ``ascend_aoti_<n>.pt2`` (``compile="blocks"``): one AOTInductor package per compiled block
  class and call signature (`compilation/aot_blocks.py`). A warm process runs a block call with
  that signature through it: no dynamo trace, no fusion pass, no Inductor compile.
- ``ascend_inductor_cache.bin``: torch's own portable compile cache
  (`torch.compiler.save_cache_artifacts`: Inductor's FX graph cache and the AOTAutograd cache),
  which serves every other call.
- ``ascend_cpp_kernels.tar`` (CPU only): the C++ kernel libraries Inductor built, which the
  portable cache leaves out and a fresh process would rebuild with the host compiler.

`enable_ascend_compile(obj, ..., cache=path_or_repo_id)` validates the manifest against the
running process before it reads any artifact: a mismatch (another torch, platform, CPU, config or
pass source) is a warning and a normal compile. A manifest that is not what `save_ascend_cache`
writes, or an artifact whose sha256 differs from the manifest, is a `ValueError` and nothing is
loaded. Artifacts from the Hub need ``trust_remote_artifacts=True``: they hold compiled code that
runs in this process.

``executor="eager"`` (the NPU default) produces no compiled artifact: `save_ascend_cache`
refuses it with that reason. What each part saves a warm process: docs/warm-start.md.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform as _platform
import re
import sys
import tarfile
import tempfile
import warnings
from typing import Any

import torch

__all__ = [
    "ARTIFACTS_NAME",
    "TorchCaches",
    "KERNELS_NAME",
    "MANIFEST_NAME",
    "cache_info",
    "load_ascend_cache",
    "package_counters",
    "save_ascend_cache",
]

MANIFEST_NAME = "ascend_cache.json"
ARTIFACTS_NAME = "ascend_inductor_cache.bin"
KERNELS_NAME = "ascend_cpp_kernels.tar"
FORMAT = 2
MECHANISM = "inductor-mega-cache+aoti-blocks"
_PACKAGE_NAME = re.compile(r"^ascend_aoti_[0-9]{1,4}\.pt2$")
# What must equal the running process for the artifacts to be used (manifest key -> meaning).
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
_FILE_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_SHA = re.compile(r"^[0-9a-f]{64}$")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def expected_keys(cfg) -> dict[str, str]:
    """The manifest keys the running process produces for `cfg` (an `AscendConfig`).

    >>> from diffusers_ascend.config import AscendConfig
    >>> sorted(expected_keys(AscendConfig(executor="inductor")))[:3]
    ['config_hash', 'device', 'diffusers_ascend']
    """
    from . import __version__
    from .compilation.passes import ordered_fusions
    from .compilation.passes.manager import FusionPassManager
    from .platform import current_platform

    plat = current_platform()
    return {
        "torch": torch.__version__,
        "platform": plat,
        "machine": _platform.machine(),
        "device": _device_capability(plat),
        "python": "%d.%d" % sys.version_info[:2],
        "diffusers_ascend": __version__,
        "config_hash": cfg.cache_key(),
        "pass_hash": FusionPassManager(ordered_fusions(cfg.resolved_fusions(plat))).uuid(),
        "executor": cfg.resolved_executor(plat),
    }


def _device_capability(plat: str) -> str:
    """What compiled code is specific to beyond the architecture. Inductor builds CPU code (the
    C++ kernels, AOTInductor packages and their host-side wrappers) with ``-march=native``, so it
    may use any instruction of the building CPU: its ATen capability and a hash of its feature
    flags must both match. On an accelerator, its generation too."""
    parts = [f"cpu:{torch.backends.cpu.get_cpu_capability()}:{_cpu_features()}"]
    if plat == "cuda" and torch.cuda.is_available():
        parts.append("cuda:sm_%d%d" % torch.cuda.get_device_capability())
    elif plat == "npu":
        npu = getattr(torch, "npu", None)
        parts.append(f"npu:{npu.get_device_name() if npu is not None and hasattr(npu, 'get_device_name') else 'unknown'}")
    return ";".join(parts)


def _cpu_features() -> str:
    """A short hash of the CPU's feature flags (Linux ``/proc/cpuinfo``: ``flags`` on x86,
    ``Features`` on Arm), else of the processor name."""
    text = _platform.processor() or _platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    text = " ".join(sorted(value.split()))
                    break
    except OSError:
        pass
    return _sha256(text.encode())[:16]


def _enabled_states(obj) -> list:
    from .mixin import _models

    states = [getattr(m, "_ascend_state", None) for _, m in _models(obj)]
    return [s for s in states if s is not None]


# -- save ------------------------------------------------------------------------------------------
def save_ascend_cache(obj, save_directory: str | os.PathLike) -> dict[str, Any]:
    """Writes the compile artifacts of an enabled, called pipeline or model to `save_directory`.

    Args:
        obj: a pipeline or model enabled with ``executor="inductor"`` (or ``"auto"`` resolving to
            it) whose compiled blocks ran at least once in this process.
        save_directory: a directory (created if missing); it can sit next to the model's
            ``save_pretrained`` output and be pushed with it.

    Returns:
        The manifest written (a dict).

    Raises:
        ValueError: `obj` is not enabled, has compiled nothing yet, uses the eager executor, or
            torch has no portable compile cache (2.6). Nothing is written then.

    >>> import diffusers_ascend, tempfile
    >>> from diffusers_ascend.tiny import tiny_flux_transformer
    >>> model = diffusers_ascend.enable_ascend_compile(tiny_flux_transformer(), executor="inductor")
    >>> diffusers_ascend.save_ascend_cache(model, tempfile.mkdtemp())  # doctest: +SKIP
    """
    from .compilation import _compat

    states = _enabled_states(obj)
    if not states:
        raise ValueError(f"{type(obj).__name__} is not enabled: call enable_ascend_compile(..., executor='inductor') first.")
    cfg = states[0].config
    keys = expected_keys(cfg)
    if cfg.compile == "none":
        raise ValueError("compile='none' compiles nothing, so there is nothing to save; use compile='blocks' or 'model'.")
    if keys["executor"] != "inductor":
        raise ValueError(
            f"executor={keys['executor']!r} produces no compiled artifact to save: it runs the fused graph op by op, "
            "and dynamo tracing, the aot trace and the fusion passes run in every process (torch has no portable "
            "form of them). Use executor='inductor' to save Inductor's compile results."
        )
    for s in states:  # caches loaded lazily must be in torch before its artifacts are collected
        if s.backend is not None and s.backend.deferred_caches is not None:
            s.backend.deferred_caches()
    if not any(s.backend is not None and s.backend.report.graphs_compiled for s in states):
        raise ValueError(f"{type(obj).__name__} has compiled no graph yet: call it once, then save.")
    api = _compat.cache_artifacts_api()
    if api is None:
        raise ValueError(
            f"torch {torch.__version__} has no portable compile cache (torch.compiler.save_cache_artifacts, "
            "torch 2.7+): nothing can be saved on it."
        )
    saved = api[0]()
    if saved is None or not saved[0]:
        raise ValueError(
            "torch.compiler.save_cache_artifacts() returned nothing: Inductor's caches were off or bypassed for "
            "these graphs (TORCHINDUCTOR_FX_GRAPH_CACHE=0?), so there is nothing to save."
        )
    blobs = {ARTIFACTS_NAME: saved[0]}
    root = _compat.inductor_cache_dir()
    kernels = _pack_kernels(_compat.compiled_cpp_libraries() + _built_this_process(root), root)
    if kernels is not None:
        blobs[KERNELS_NAME] = kernels
    # After the kernels are collected: packaging builds libraries of its own, inside the package.
    blocks = _build_packages(obj, blobs)
    manifest = {
        "format": FORMAT,
        "mechanism": MECHANISM,
        **keys,
        "files": {name: {"sha256": _sha256(data), "size": len(data)} for name, data in blobs.items()},
        "blocks": blocks,
    }
    os.makedirs(save_directory, exist_ok=True)
    for name, data in blobs.items():
        _write_atomic(os.path.join(save_directory, name), data)
    # The manifest last: a directory with a manifest always has the files it names.
    _write_atomic(os.path.join(save_directory, MANIFEST_NAME), (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())
    return manifest


def _build_packages(obj, blobs: dict[str, bytes]) -> list[dict[str, Any]]:
    """One AOTInductor package per recorded call signature of a compiled block class
    (`compilation/aot_blocks.py`), added to `blobs`; returns their manifest entries. A signature
    that cannot be packaged is left to torch's caches, with a warning naming the cause."""
    from .compilation import _compat
    from .compilation.aot_blocks import build_package
    from .compilation.backend import describe_failure
    from .mixin import _models

    entries: list[dict[str, Any]] = []
    for model_name, model in _models(obj):
        state = getattr(model, "_ascend_state", None)
        if state is None or not state.signatures:
            continue
        if _compat.aoti_api() is None:
            warnings.warn(f"diffusers_ascend: torch {torch.__version__} has no AOTInductor packaging: the cache holds "
                          "torch's compile caches only.", stacklevel=3)
            return entries
        state.backend.ensure_verified()
        for label, signature, ref in [(k, sig, ref) for k, v in sorted(state.signatures.items()) for sig, ref in v]:
            block = ref()
            if block is None:
                continue
            name = f"ascend_aoti_{len(entries)}.pt2"
            with tempfile.TemporaryDirectory(prefix="ascend-aoti-") as tmp:
                path = os.path.join(tmp, name)
                try:
                    info = build_package(block, signature, state.backend.manager, path)
                except Exception as e:  # noqa: BLE001 - any failure leaves the class to the JIT caches
                    warnings.warn(f"diffusers_ascend: {model_name or type(model).__name__}.{label} was not packaged "
                                  f"ahead of time ({describe_failure(e)}); a process loading this cache compiles it "
                                  "from torch's caches.", stacklevel=3)
                    continue
                with open(path, "rb") as f:
                    blobs[name] = f.read()
            entries.append({"model": model_name, "class": label, "file": name, "signature": signature.to_json(), **info})
    return entries


def _write_atomic(path: str, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _built_this_process(root: str) -> list[str]:
    """``.so`` files Inductor wrote under `root` since this process started: besides the graphs'
    kernel libraries, the vector-ISA probes (``cpu_vec_isa``: one tiny build per ISA the first time
    a process picks one), which the portable cache does not carry either. Linux: the start time is
    the ctime of ``/proc/<pid>``; elsewhere only the loaded libraries are shipped."""
    try:
        start = os.stat(f"/proc/{os.getpid()}").st_ctime
    except OSError:
        return []
    out = []
    for sub in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        d = os.path.join(root, sub)
        if len(sub) != 2 or not os.path.isdir(d):
            continue
        for name in sorted(os.listdir(d)):
            path = os.path.join(d, name)
            if name.endswith(".so") and os.path.getmtime(path) >= start - 1:
                out.append(path)
    return out


def _pack_kernels(paths: list[str], root: str) -> bytes | None:
    """A tar of the libraries under `root`, named by their path relative to it (None if none)."""
    root = os.path.realpath(root)
    buf = io.BytesIO()
    count = 0
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(set(paths)):
            real = os.path.realpath(path)
            if not real.startswith(root + os.sep) or not os.path.isfile(real):
                continue  # built outside the cache root (an AOTInductor output_path...): not ours to ship
            rel = os.path.relpath(real, root)
            info = tar.gettarinfo(real, arcname=rel.replace(os.sep, "/"))
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            with open(real, "rb") as f:
                tar.addfile(info, f)
            count += 1
    return buf.getvalue() if count else None


# -- load ------------------------------------------------------------------------------------------
def _is_remote(source) -> bool:
    return isinstance(source, str) and not os.path.exists(source)


def _resolve(source, name: str, **hub_kwargs) -> str:
    from .hub import resolve_config_file

    return resolve_config_file(source, name, **hub_kwargs)


def read_manifest(path: str) -> dict[str, Any]:
    """The manifest at `path`, checked to be exactly what `save_ascend_cache` writes.

    A manifest of an older format (1: no block packages, no ``device`` key) is returned as read,
    for `mismatches` to report; nothing of it is loaded.

    Raises:
        ValueError: not a JSON object of the expected keys and types (names the problem).
    """
    from .config import read_json_object

    data = read_json_object(path, what="an ascend cache manifest")
    where = f"{path} is not a valid {MANIFEST_NAME} (tampered or corrupt?)"
    if data.get("format") == 1 and isinstance(data.get("diffusers_ascend"), str):
        return data  # an older diffusers-ascend wrote it: a mismatch, never loaded
    if set(data) != _MANIFEST_KEYS:
        missing, extra = sorted(_MANIFEST_KEYS - set(data)), sorted(set(data) - _MANIFEST_KEYS)
        raise ValueError(f"{where}: missing keys {missing}, unknown keys {extra}")
    if data["format"] != FORMAT or data["mechanism"] != MECHANISM:
        raise ValueError(f"{where}: format {data['format']!r} / mechanism {data['mechanism']!r}; "
                         f"this diffusers-ascend reads format {FORMAT} / {MECHANISM!r}")
    for key in KEY_FIELDS:
        if not isinstance(data[key], str):
            raise ValueError(f"{where}: {key!r} must be a string, got {type(data[key]).__name__}")
    files, blocks = data["files"], data["blocks"]
    if not isinstance(blocks, list):
        raise ValueError(f"{where}: 'blocks' must be a list")
    for i, block in enumerate(blocks):
        _check_block_entry(block, where=f"{where}: blocks[{i}]")
    packages = {b["file"] for b in blocks}
    allowed = {ARTIFACTS_NAME, KERNELS_NAME} | packages
    if (not isinstance(files, dict) or ARTIFACTS_NAME not in files or not set(files) <= allowed
            or not packages <= set(files) or len(packages) != len(blocks)):
        raise ValueError(f"{where}: 'files' must name {ARTIFACTS_NAME!r}, optionally {KERNELS_NAME!r}, and each "
                         "block's package exactly once")
    for name, entry in files.items():
        if (not isinstance(entry, dict) or set(entry) != {"sha256", "size"} or not isinstance(entry["sha256"], str)
                or not _SHA.match(entry["sha256"]) or type(entry["size"]) is not int or entry["size"] < 0):
            raise ValueError(f"{where}: files[{name!r}] must be {{'sha256': <64 hex digits>, 'size': <bytes>}}")
    return data


def _check_block_entry(block: Any, where: str) -> None:
    """A ``blocks`` entry: the keys `_build_packages` writes, each of its type (the signature and
    the output spec are parsed, as data, by `aot_blocks`)."""
    from .compilation.aot_blocks import CallSignature, parse_outputs, parse_state

    if not isinstance(block, dict) or set(block) != _BLOCK_KEYS:
        raise ValueError(f"{where} must have exactly the keys {sorted(_BLOCK_KEYS)}")
    if not all(isinstance(block[k], str) for k in ("model", "class", "file", "outputs")):
        raise ValueError(f"{where}: 'model', 'class', 'file' and 'outputs' must be strings")
    if not _PACKAGE_NAME.match(block["file"]):
        raise ValueError(f"{where}: package file {block['file']!r} is not named ascend_aoti_<n>.pt2")
    matches = block["matches"]
    if not isinstance(matches, dict) or not all(isinstance(k, str) and type(v) is int and v >= 0 for k, v in matches.items()):
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
        return [f"manifest format: saved {manifest.get('format')!r} by diffusers-ascend "
                f"{manifest.get('diffusers_ascend')!r}, here {FORMAT}"]
    here = expected_keys(cfg)
    return [f"{KEY_FIELDS[k]}: saved {manifest[k]!r}, here {here[k]!r}" for k in KEY_FIELDS if manifest[k] != here[k]]


def load_ascend_cache(source, cfg, *, trust_remote_artifacts: bool = False, **hub_kwargs) -> dict[str, Any] | None:
    """Validates the artifacts at `source` for `cfg`, loads its block packages and hands the rest to
    torch's caches (see `TorchCaches`).

    Args:
        source: a local directory written by `save_ascend_cache`, or a Hub repo id.
        cfg: the `AscendConfig` the model is about to be enabled with.
        trust_remote_artifacts: required for a Hub repo id: the artifacts hold compiled code
            that runs in this process.
        **hub_kwargs: ``revision``, ``cache_dir``, ``local_files_only``, ``token``, ``subfolder``.

    Returns:
        ``{"source", "artifacts", "blocks", "caches"}``: the loaded block packages (`AotBlock`
        entries) and the `TorchCaches` (already handed to torch unless packages were loaded); or
        None when the manifest was made for another process (with a warning naming each
        difference: compilation proceeds normally).

    Raises:
        ValueError: a remote source without `trust_remote_artifacts`, a malformed manifest, or an
            artifact whose sha256 differs from the manifest. Nothing is loaded or written then.
        AscendConfigNotFoundError: no manifest at `source`.
    """
    from .compilation import _compat

    if _is_remote(source) and not trust_remote_artifacts:
        raise ValueError(
            f"{source!r} is not a local directory, so it names a Hub repo: refusing to load compile artifacts from it "
            "without trust_remote_artifacts=True: they contain compiled code that runs "
            "in this process. Pass trust_remote_artifacts=True if you trust the repo (like trust_remote_code), or "
            "download and inspect them, then pass the local directory."
        )
    manifest = read_manifest(_resolve(source, MANIFEST_NAME, **hub_kwargs))
    diffs = mismatches(manifest, cfg)
    api = _compat.cache_artifacts_api()
    if api is None:
        diffs.append(f"torch {torch.__version__} cannot load portable compile caches (torch 2.7+)")
    if diffs:
        warnings.warn(
            f"diffusers_ascend: the compile artifacts at {source!r} were made for another setup ({'; '.join(diffs)}); "
            "ignoring them and compiling normally.",
            stacklevel=3,
        )
        return None
    blobs = {}
    for name, entry in manifest["files"].items():
        path = _resolve(source, name, **hub_kwargs)
        with open(path, "rb") as f:
            data = f.read(entry["size"] + 1)
        if len(data) != entry["size"] or _sha256(data) != entry["sha256"]:
            raise ValueError(f"{path} does not match the sha256/size in its {MANIFEST_NAME} (tampered or corrupt?): "
                             "nothing was loaded.")
        blobs[name] = data
    members = _check_kernels(blobs[KERNELS_NAME]) if KERNELS_NAME in blobs else []
    caches = TorchCaches(blobs[ARTIFACTS_NAME], blobs.get(KERNELS_NAME), members, source)
    blocks = _load_packages(manifest["blocks"], blobs, source)
    if not blocks:
        caches()  # no package takes any call: every graph compiles, from these caches
    return {"source": os.fspath(source), "artifacts": sorted(blobs), "blocks": blocks, "caches": caches}


class TorchCaches:
    """The validated mega-cache and kernel archive of a cache directory, handed to torch when first
    needed: at enable when no block package was loaded, else at the first graph a backend compiles
    (a call no package takes) or at `save_ascend_cache`. Handing them over costs a quarter of a
    second on the 2-core CPU, which a process whose packages take every call never pays.

    Calling it again does nothing; a failure is a warning (the graphs compile without the caches).
    """

    def __init__(self, artifacts: bytes, kernels: bytes | None, members: list, source) -> None:
        self.artifacts, self.kernels, self.members, self.source = artifacts, kernels, members, source
        self.done = False
        self.kernels_installed = 0

    def __call__(self) -> None:
        if self.done:
            return
        self.done = True
        from .compilation import _compat

        # Possibly inside a compile: torch's cache loaders must not see dynamo's fake mode.
        with _compat.unset_fake_mode(), _compat.no_tracing_context():
            try:
                _compat.cache_artifacts_api()[1](self.artifacts)
                if self.members:
                    self.kernels_installed = _install_kernels(self.kernels, self.members, _compat.inductor_cache_dir())
            except Exception as e:  # noqa: BLE001 - the graphs still compile, without the caches
                from .compilation.backend import describe_failure

                warnings.warn(f"diffusers_ascend: torch did not take the compile caches of {self.source!r} "
                              f"({describe_failure(e)}); compiling without them.", stacklevel=2)


def _load_packages(entries: list[dict[str, Any]], blobs: dict[str, bytes], source) -> list[dict[str, Any]]:
    """Loads each block package (already checked against the manifest) from a private copy of its
    verified bytes. One that fails to load is left out with a warning: its class compiles normally."""
    from .compilation.aot_blocks import AotBlock, CallSignature, temporary_file
    from .compilation.backend import describe_failure

    out = []
    for entry in entries:
        with temporary_file(blobs[entry["file"]], suffix=".pt2") as path:
            try:
                block = AotBlock.load(path, CallSignature.from_json(entry["signature"]), entry["state"], entry["outputs"])
            except Exception as e:  # noqa: BLE001 - the JIT caches still serve this class
                warnings.warn(f"diffusers_ascend: the package of {entry['class']} at {source!r} did not load "
                              f"({describe_failure(e)}); it compiles normally.", stacklevel=4)
                continue
        out.append({**{k: entry[k] for k in ("model", "class", "file", "matches", "ops_before", "ops_after")},
                    "block": block})
    return out


def _check_kernels(data: bytes) -> list[tarfile.TarInfo]:
    """The members of a kernels tar, each a regular ``.so`` file at a plain relative path."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        members = tar.getmembers()
    for m in members:
        parts = m.name.split("/")
        if (not m.isfile() or not m.name.endswith(".so") or m.name.startswith("/")
                or any(p in ("", ".", "..") or not _FILE_NAME.match(p) for p in parts)):
            raise ValueError(f"{KERNELS_NAME} holds {m.name!r}: only regular .so files at plain relative paths are "
                             "allowed (tampered?); nothing was loaded.")
    return members


def _install_kernels(data: bytes, members: list[tarfile.TarInfo], root: str) -> int:
    """Writes each library under Inductor's cache root where Inductor looks it up (its path is
    derived from the hash of the kernel source and compile command). Existing files are kept."""
    n = 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for m in members:
            dest = os.path.join(root, *m.name.split("/"))
            if os.path.exists(dest):
                continue
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            _write_atomic(dest, tar.extractfile(m).read())
            os.chmod(dest, 0o755)
            n += 1
    return n


def package_counters(obj) -> dict[str, int]:
    """Block packages loaded into an enabled pipeline or model, the calls they ran, and the calls of
    a packaged block class that no package took (another signature, gradients, hooks), which went
    to the compiled path.

    >>> from diffusers_ascend.tiny import tiny_flux_transformer
    >>> package_counters(tiny_flux_transformer())
    {'packages': 0, 'calls': 0, 'passed_on': 0}
    """
    states = _enabled_states(obj)
    blocks = [b for s in states for v in s.aot_blocks.values() for b in v]
    return {"packages": len(blocks), "calls": sum(b.hits for b in blocks),
            "passed_on": sum(s.packages_passed_on for s in states)}


# -- info -------------------------------------------------------------------------------------------
def cache_info(source, cfg=None, **hub_kwargs) -> dict[str, Any]:
    """The manifest at `source` (a local directory or a Hub repo id; only the JSON is downloaded),
    plus ``"matches_here"`` and ``"mismatches"`` against `cfg` (the saved config hash is not
    checked without `cfg`).

    >>> cache_info("/nonexistent")  # doctest: +SKIP
    """
    from .config import AscendConfig

    manifest = read_manifest(_resolve(source, MANIFEST_NAME, **hub_kwargs))
    diffs = mismatches(manifest, cfg if cfg is not None else AscendConfig(executor=manifest["executor"]))
    if cfg is None:
        diffs = [d for d in diffs if not d.startswith((KEY_FIELDS["config_hash"], KEY_FIELDS["pass_hash"]))]
    return {**manifest, "matches_here": not diffs, "mismatches": diffs}


def push_ascend_cache(save_directory: str | os.PathLike, repo_id: str, **kwargs) -> Any:
    """Uploads the manifest and artifacts of `save_directory` to the Hub repo `repo_id` in one commit
    (next to ``ascend_config.json``). Validates the directory first.

    Args:
        kwargs: ``token``, ``private``, ``revision``, ``commit_message``, ``create_pr``.
    """
    from .hub import upload_files

    manifest = read_manifest(os.path.join(save_directory, MANIFEST_NAME))
    names = [MANIFEST_NAME, *manifest["files"]]
    files = {n: os.path.join(save_directory, n) for n in names}
    kwargs.setdefault("commit_message", "Upload diffusers-ascend compile artifacts")
    return upload_files(files, repo_id, **kwargs)


def pull_ascend_cache(repo_id: str, save_directory: str | os.PathLike, *, trust_remote_artifacts: bool = False,
                      **hub_kwargs) -> dict[str, Any]:
    """Downloads a Hub repo's manifest and artifacts into `save_directory` after checking them
    (``trust_remote_artifacts=True`` is required, as for loading: the files hold compiled code).
    Nothing is loaded into torch."""
    if not trust_remote_artifacts:
        raise ValueError(f"refusing to download compile artifacts from {repo_id!r} without trust_remote_artifacts=True: "
                         "they contain compiled code that runs when loaded.")
    manifest = read_manifest(_resolve(repo_id, MANIFEST_NAME, **hub_kwargs))
    blobs = {}
    for name, entry in manifest["files"].items():
        with open(_resolve(repo_id, name, **hub_kwargs), "rb") as f:
            data = f.read()
        if _sha256(data) != entry["sha256"]:
            raise ValueError(f"{repo_id}/{name} does not match the sha256 in its {MANIFEST_NAME}: nothing was written.")
        if name == KERNELS_NAME:
            _check_kernels(data)
        blobs[name] = data
    os.makedirs(save_directory, exist_ok=True)
    for name, data in blobs.items():
        _write_atomic(os.path.join(save_directory, name), data)
    _write_atomic(os.path.join(save_directory, MANIFEST_NAME), (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())
    return manifest
