"""Warm start under faults and hostile artifacts (issue 26): saves that fail, are killed or race,
manifests and archives that lie, an opt-in given as a string, a package entry naming another
package. Each test reproduces a failure of the code before the fix.

Caches are written by `save_ascend_cache` (a tiny Flux compiled once per module), by
`pull_ascend_cache` from a fake offline Hub cache, or in the saved layout by `_write_cache`.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import signal
import stat
import subprocess
import sys
import tarfile
import textwrap
import threading
from unittest import mock

import pytest
import torch

import diffusers_ascend
from diffusers_ascend import warm_start
from diffusers_ascend.cli import main
from diffusers_ascend.compilation import _compat
from diffusers_ascend.config import AscendConfig
from diffusers_ascend.tiny import FLUX_TRANSFORMER_CONFIG, tiny_flux_transformer
from diffusers_ascend.warm_start.kernels import check_kernels, install_kernels
from tests.test_warm_start import SHA, _Block, _write_cache, loads  # noqa: F401 (a fixture)

CFG = AscendConfig(fusions=["rms_norm"], executor="inductor", compile="blocks")
MODEL_LAYERS = dict(num_layers=1, num_single_layers=0)


def _listing(path) -> list[str]:
    return sorted(os.listdir(path))


def _load(directory, monkeypatch, cfg=CFG, **kwargs):
    """`load_ascend_cache` of `directory` for `cfg`, with torch's cache loader recording what it is
    handed instead of loading it: returns those bytes (the checks before are the real ones)."""
    got = []
    monkeypatch.setattr(_compat, "cache_artifacts_api", lambda: (None, got.append))
    monkeypatch.setattr(_compat, "inductor_cache_dir", lambda: str(directory) + "-inductor")
    assert warm_start.load_ascend_cache(str(directory), cfg, **kwargs) is not None
    return got


def _hub(root, repo_id, payload, keys=None):
    """A fake offline Hub cache holding a valid cache for this process, whose mega-cache is `payload`."""
    snap = root / ("models--" + repo_id.replace("/", "--"))
    (snap / "refs").mkdir(parents=True, exist_ok=True)
    (snap / "refs" / "main").write_text(SHA)
    return _write_cache(snap / "snapshots" / SHA, keys or warm_start.expected_keys(CFG), payload=payload)


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    return tmp_path / "hub"


@pytest.fixture(scope="module")
def compiled():
    """A tiny Flux compiled with executor='inductor' (compile='model': no package to build, so a
    save costs only its writes) and called once: what `save_ascend_cache` needs."""
    from diffusers_ascend.tiny import flux_model_inputs

    model = tiny_flux_transformer(**MODEL_LAYERS)
    diffusers_ascend.enable_ascend_compile(model, fusions=["rms_norm"], executor="inductor", compile="model")
    with torch.no_grad():
        model(**flux_model_inputs(4, 4, config={**FLUX_TRANSFORMER_CONFIG, **MODEL_LAYERS}))
    return model


# -- item 4: all-or-nothing saves -------------------------------------------------------------------------
def test_a_save_that_fails_half_way_leaves_the_previous_cache(tmp_path, monkeypatch, compiled):
    target = tmp_path / "cache"
    previous = _write_cache(target, warm_start.expected_keys(CFG))
    (target / "config.json").write_text("{}")  # a save_pretrained output beside the cache is kept
    real_fdopen, opened = os.fdopen, []

    def disk_full_at_the_second_file(fd, mode="r", *args, **kwargs):
        f = real_fdopen(fd, mode, *args, **kwargs)
        if "w" in mode:
            opened.append(fd)
            if len(opened) == 2:
                f.close()
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return f

    with mock.patch.object(os, "fdopen", disk_full_at_the_second_file):
        with pytest.raises(OSError, match="No space left"):
            diffusers_ascend.save_ascend_cache(compiled, target)
    assert len(opened) == 2
    assert json.loads((target / warm_start.MANIFEST_NAME).read_text()) == previous
    assert _load(target, monkeypatch) == [b"mega-cache bytes"]  # the previous cache, whole
    assert _listing(tmp_path) == ["cache"] and ".tmp" not in "".join(_listing(target))
    monkeypatch.undo()  # torch's real cache API again, for the save
    manifest = diffusers_ascend.save_ascend_cache(compiled, target)  # the next save replaces it whole
    assert json.loads((target / warm_start.MANIFEST_NAME).read_text()) == manifest
    assert (target / "config.json").read_text() == "{}" and _listing(tmp_path) == ["cache"]


_KILLED_PULL = textwrap.dedent("""
    import os, sys, time
    import huggingface_hub.constants
    from diffusers_ascend import warm_start
    huggingface_hub.constants.HF_HUB_OFFLINE = True
    huggingface_hub.constants.HF_HUB_CACHE = sys.argv[1]
    fsync = os.fsync
    def slow_fsync(fd):  # the first file is on disk: wait there to be killed
        fsync(fd)
        print("WROTE", flush=True)
        time.sleep(60)
    os.fsync = slow_fsync
    warm_start.pull_ascend_cache("org/new", sys.argv[2], trust_remote_artifacts=True)
    print("FINISHED", flush=True)
""")


def test_a_save_killed_half_way_leaves_the_previous_cache_and_no_litter(tmp_path, monkeypatch, offline_hub):
    target = tmp_path / "out" / "cache"
    _write_cache(target, warm_start.expected_keys(CFG), payload=b"previous cache")
    _hub(offline_hub, "org/new", b"new cache")
    env = {**os.environ, "PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_PULL, str(offline_hub), str(target)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = proc.stdout.readline()
        assert line.strip() == "WROTE", proc.stderr.read()[-3000:]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        proc.stdout.close()
        proc.stderr.close()
    assert _load(target, monkeypatch) == [b"previous cache"]
    assert ".tmp" not in "".join(_listing(target))
    # The next save of this directory succeeds and takes the killed one's staging with it.
    warm_start.pull_ascend_cache("org/new", target, trust_remote_artifacts=True)
    assert _load(target, monkeypatch) == [b"new cache"] and _listing(tmp_path / "out") == ["cache"]


def test_concurrent_saves_leave_one_whole_cache_and_readers_see_whole_caches(tmp_path, monkeypatch, offline_hub):
    target = tmp_path / "cache"
    payloads = {f"org/saver{i}": f"cache of saver {i}".encode() * 1000 for i in range(3)}
    for repo, payload in payloads.items():
        _hub(offline_hub, repo, payload)
    warm_start.pull_ascend_cache("org/saver0", target, trust_remote_artifacts=True)
    got = []
    monkeypatch.setattr(_compat, "cache_artifacts_api", lambda: (None, got.append))
    monkeypatch.setattr(_compat, "inductor_cache_dir", lambda: str(tmp_path / "inductor"))
    errors, done = [], threading.Event()

    def save(repo):
        try:
            for _ in range(5):
                warm_start.pull_ascend_cache(repo, target, trust_remote_artifacts=True)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def read():
        while not done.is_set():
            try:
                warm_start.load_ascend_cache(str(target), CFG)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

    savers = [threading.Thread(target=save, args=(repo,)) for repo in payloads]
    reader = threading.Thread(target=read)
    reader.start()
    for t in savers:
        t.start()
    for t in savers:
        t.join()
    done.set()
    reader.join()
    assert errors == []
    assert len(got) > 1 and set(got) <= set(payloads.values())  # every read was one saver's whole cache
    assert _load(target, monkeypatch)[0] in payloads.values() and _listing(tmp_path) == ["cache", "hub"]


class _Interleave:
    """Runs a step (a whole save) when the reader thread is about to open a cache file of `target`:
    the interleavings of a load and concurrent saves, forced in one thread, in order."""

    def __init__(self, monkeypatch, target, steps):
        import builtins

        self.target, self.steps, self.seen, self.reader = os.fspath(target), list(steps), [], threading.get_ident()
        real = builtins.open

        def hooked(path, *args, **kwargs):
            name = os.path.basename(os.fspath(path)) if isinstance(path, (str, os.PathLike)) else None
            if (
                threading.get_ident() == self.reader
                and isinstance(path, (str, os.PathLike))
                and os.path.dirname(os.fspath(path)) == self.target
                and self.steps
                and self.steps[0][0] == name
            ):
                self.seen.append(name)
                self.steps.pop(0)[1]()
            return real(path, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", hooked)


def _pull(repo, target):
    return lambda: warm_start.pull_ascend_cache(repo, target, trust_remote_artifacts=True)


def test_a_load_between_saves_of_two_caches_and_back_reads_one_whole_cache(tmp_path, monkeypatch, offline_hub):
    """The interleaving `test_concurrent_saves_*` met once under load: the reader reads cache A's
    manifest; a save of B swaps B in before the reader opens the mega-cache (B's bytes: no match);
    a save of A swaps an equal A back in before the reader reads the manifest again, which is
    unchanged, so a reader that compares manifests took the mismatch for corruption."""
    target = tmp_path / "cache"
    for repo in ("org/a", "org/b"):
        _hub(offline_hub, repo, f"cache {repo}".encode() * 100)
    _pull("org/a", target)()
    got = []
    monkeypatch.setattr(_compat, "cache_artifacts_api", lambda: (None, got.append))
    monkeypatch.setattr(_compat, "inductor_cache_dir", lambda: str(tmp_path / "inductor"))
    hook = _Interleave(
        monkeypatch,
        target,
        [(warm_start.ARTIFACTS_NAME, _pull("org/b", target)), (warm_start.MANIFEST_NAME, _pull("org/a", target))],
    )
    assert warm_start.load_ascend_cache(str(target), CFG) is not None
    assert hook.steps == [] and hook.seen == [warm_start.ARTIFACTS_NAME, warm_start.MANIFEST_NAME]  # both saves ran
    assert got == [b"cache org/a" * 100]
    assert _listing(tmp_path) == ["cache", "hub"]


def test_a_load_that_every_save_interrupts_reads_under_the_savers_lock(tmp_path, monkeypatch, offline_hub):
    """A save swaps a new cache in before each lock-free read of the manifest finishes; the last
    read holds the savers' lock (a save cannot take it meanwhile) and returns one whole cache."""
    import fcntl

    from diffusers_ascend.warm_start import store

    target = tmp_path / "cache"
    for repo in ("org/a", "org/b"):
        _hub(offline_hub, repo, f"cache {repo}".encode() * 100)
    _pull("org/a", target)()
    got, locked = [], []
    monkeypatch.setattr(_compat, "cache_artifacts_api", lambda: (None, got.append))
    monkeypatch.setattr(_compat, "inductor_cache_dir", lambda: str(tmp_path / "inductor"))

    def save_unless_locked(repo):
        def step():
            fd = os.open(tmp_path, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)
            except BlockingIOError:
                locked.append(True)
                return
            finally:
                os.close(fd)
            locked.append(False)
            _pull(repo, target)()

        return step

    steps = [
        (warm_start.ARTIFACTS_NAME, save_unless_locked("org/b" if i % 2 == 0 else "org/a"))
        for i in range(store._LOCK_FREE_READS + 1)
    ]
    hook = _Interleave(monkeypatch, target, steps)
    assert warm_start.load_ascend_cache(str(target), CFG) is not None
    assert hook.steps == [] and locked == [False] * store._LOCK_FREE_READS + [True]
    assert got == [(target / warm_start.ARTIFACTS_NAME).read_bytes()]  # the cache the last save left, whole


def test_a_save_carries_other_files_over_and_refuses_subdirectories(tmp_path, offline_hub):
    _hub(offline_hub, "org/warm", b"mega-cache bytes")
    target = tmp_path / "model"
    target.mkdir()
    (target / "config.json").write_text("{}")
    (target / "weights.safetensors").symlink_to(tmp_path / "elsewhere")
    warm_start.pull_ascend_cache("org/warm", target, trust_remote_artifacts=True)
    assert _listing(target) == sorted(
        [warm_start.ARTIFACTS_NAME, warm_start.MANIFEST_NAME, "config.json", "weights.safetensors"]
    )
    assert os.readlink(target / "weights.safetensors") == str(tmp_path / "elsewhere")
    (target / "transformer").mkdir()
    with pytest.raises(ValueError, match="holds 'transformer', which is not a file"):
        warm_start.pull_ascend_cache("org/warm", target, trust_remote_artifacts=True)
    assert "transformer" in _listing(target) and _listing(tmp_path) == ["hub", "model"]


def test_a_save_without_an_atomic_exchange_renames_twice(tmp_path, monkeypatch, offline_hub):
    # Where renameat2(RENAME_EXCHANGE) is missing: the old directory is renamed aside, the new one
    # in, the old one removed; the result is the same and nothing is left beside it.
    _hub(offline_hub, "org/old", b"old cache")
    _hub(offline_hub, "org/new", b"new cache")
    warm_start.pull_ascend_cache("org/old", tmp_path / "cache", trust_remote_artifacts=True)
    monkeypatch.setattr(warm_start.store, "_exchange", lambda a, b: False)
    warm_start.pull_ascend_cache("org/new", tmp_path / "cache", trust_remote_artifacts=True)
    assert _load(tmp_path / "cache", monkeypatch) == [b"new cache"] and _listing(tmp_path) == ["cache", "hub"]


def test_saving_into_a_file_fails_before_any_compile(tmp_path, monkeypatch, compiled):
    path = tmp_path / "a-file"
    path.write_text("not a directory")
    built = []
    monkeypatch.setattr(warm_start.save, "build_packages", lambda obj, blobs: built.append(obj) or [])
    with pytest.raises(ValueError, match="exists and is not a directory"):
        diffusers_ascend.save_ascend_cache(compiled, path)
    assert built == [] and path.read_text() == "not a directory"


# -- item 9: the umask decides the modes ------------------------------------------------------------------
@pytest.mark.parametrize(
    "umask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700), (0o002, 0o664, 0o775)]
)
def test_saved_files_honour_the_umask(tmp_path, offline_hub, umask, file_mode, dir_mode):
    _hub(offline_hub, "org/warm", b"mega-cache bytes")
    previous = os.umask(umask)
    try:
        warm_start.pull_ascend_cache("org/warm", tmp_path / "cache", trust_remote_artifacts=True)
    finally:
        os.umask(previous)
    assert stat.S_IMODE(os.stat(tmp_path / "cache").st_mode) == dir_mode
    for name in _listing(tmp_path / "cache"):
        assert stat.S_IMODE(os.stat(tmp_path / "cache" / name).st_mode) == file_mode, name


def test_installed_kernels_honour_the_umask(tmp_path):
    data = _tar({"ab/kernel.so": b"\x7fELF library"})
    previous = os.umask(0o022)
    try:
        assert install_kernels(data, check_kernels(data), str(tmp_path)) == 1
    finally:
        os.umask(previous)
    assert stat.S_IMODE(os.stat(tmp_path / "ab" / "kernel.so").st_mode) == 0o755
    assert (tmp_path / "ab" / "kernel.so").read_bytes() == b"\x7fELF library" and _listing(tmp_path / "ab") == [
        "kernel.so"
    ]


# -- item 5: a package runs only the entry it was built for -------------------------------------------------
def test_swapped_package_entries_are_refused(tmp_path, monkeypatch):
    from torch._inductor import config as inductor_config

    from diffusers_ascend.compilation.passes.manager import FusionPassManager
    from diffusers_ascend.warm_start.packages import CallSignature, build_package

    if _compat.aoti_api() is None:
        pytest.skip(f"torch {torch.__version__} has no AOTInductor")
    torch.manual_seed(0)
    block = _Block().eval()
    metadata_before = dict(inductor_config.aot_inductor.metadata)
    blobs, entries = {}, []
    for i, rows in enumerate((2, 5)):  # one class, two call signatures: two packages
        sig = CallSignature.of((torch.randn(rows, 4),), {}, training=False)
        path = str(tmp_path / f"ascend_aoti_{i}.pt2")
        info = build_package(block, sig, FusionPassManager([]), path)
        with open(path, "rb") as f:
            blobs[f"ascend_aoti_{i}.pt2"] = f.read()
        entries.append(
            {"model": "", "class": "_Block", "file": f"ascend_aoti_{i}.pt2", "signature": sig.to_json(), **info}
        )
    # torch's config is as it was (AOTInductor writes its device keys into the configured dict).
    assert dict(inductor_config.aot_inductor.metadata) == metadata_before

    def write(directory, blocks):
        directory.mkdir()
        files = {warm_start.ARTIFACTS_NAME: b"mega-cache bytes", **blobs}
        for name, data in files.items():
            (directory / name).write_bytes(data)
        manifest = {
            "format": warm_start.FORMAT,
            "mechanism": warm_start.MECHANISM,
            **warm_start.expected_keys(CFG),
            "blocks": blocks,
            "files": {n: {"sha256": hashlib.sha256(d).hexdigest(), "size": len(d)} for n, d in files.items()},
        }
        (directory / warm_start.MANIFEST_NAME).write_text(json.dumps(manifest))

    write(tmp_path / "good", entries)
    loaded = warm_start.load_ascend_cache(str(tmp_path / "good"), CFG)
    x = torch.randn(5, 4)
    with torch.no_grad():
        out = loaded.blocks[1].block(block, (x,), {})
    torch.testing.assert_close(out[0], block(x)[0])

    swapped = [{**entries[0], "file": entries[1]["file"]}, {**entries[1], "file": entries[0]["file"]}]
    write(tmp_path / "swapped", swapped)
    with pytest.raises(ValueError, match="ascend_aoti_1.pt2 .* built for another call signature"):
        warm_start.load_ascend_cache(str(tmp_path / "swapped"), CFG)


def test_build_package_restores_torch_config_on_failure(monkeypatch):
    from torch._inductor import config as inductor_config

    from diffusers_ascend.compilation.passes.manager import FusionPassManager
    from diffusers_ascend.warm_start.packages import CallSignature, build_package

    before = dict(inductor_config.aot_inductor.metadata)

    def compile_that_fails(program, package_path):  # writes the configured dict, as AOTInductor does, then fails
        inductor_config.aot_inductor.metadata["written by the compile"] = "cpu"
        raise RuntimeError("C++ compile failed")

    monkeypatch.setattr(_compat, "aoti_api", lambda: (compile_that_fails, None))
    block = _Block().eval()
    with pytest.raises(RuntimeError, match="C\\+\\+ compile failed"):
        build_package(block, CallSignature.of((torch.randn(2, 4),), {}, training=False), FusionPassManager([]), "x.pt2")
    assert dict(inductor_config.aot_inductor.metadata) == before and "written by the compile" not in before


# -- item 6: bounded kernel archives ----------------------------------------------------------------------
def _tar(members: dict[str, bytes], pax: dict[str, dict[str, str]] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.pax_headers = (pax or {}).get(name, {})
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_a_sparse_kernel_member_is_refused(tmp_path, loads):
    # A 1-byte member whose sparse map places it at 64 MiB: the archive stays a few KiB.
    sparse = {"GNU.sparse.map": f"{(64 << 20) - 1},1", "GNU.sparse.size": str(64 << 20)}
    data = _tar({"ab/big.so": b"x"}, {"ab/big.so": sparse})
    assert len(data) <= 10240  # one tar record
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert tar.getmembers()[0].size == 64 << 20  # what tarfile would write out
    _write_cache(tmp_path, warm_start.expected_keys(CFG), kernels=data)
    model = tiny_flux_transformer(num_layers=1, num_single_layers=1)
    with pytest.raises(ValueError, match="only regular .so files|stored whole"):
        diffusers_ascend.enable_ascend_compile(model, CFG, cache=str(tmp_path))
    assert loads == [] and not hasattr(model, "_ascend_state")


@pytest.mark.parametrize(
    "data, needle",
    [
        (b"\0" * 10 + b"not a tar" * 100, "not a readable tar archive"),
        (_tar({"ab/k.so": b"1", "ab/k.so ": b"2"}), "only regular .so files"),
        (_tar({"ab/k.so": b"1"}), None),  # a valid one, for contrast
    ],
)
def test_kernel_archives_are_checked_as_data(data, needle):
    if needle is None:
        assert [m.name for m in check_kernels(data)] == ["ab/k.so"]
    else:
        with pytest.raises(ValueError, match=needle):
            check_kernels(data)


def test_a_kernel_member_named_twice_or_too_large_is_refused(monkeypatch):
    twice = io.BytesIO()
    with tarfile.open(fileobj=twice, mode="w") as tar:
        for payload in (b"first", b"second"):
            info = tarfile.TarInfo("ab/k.so")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    with pytest.raises(ValueError, match="once"):
        check_kernels(twice.getvalue())
    monkeypatch.setattr(warm_start.kernels, "MAX_KERNEL_BYTES", 4)
    with pytest.raises(ValueError, match="at most 4 bytes"):
        check_kernels(_tar({"ab/k.so": b"12345"}))


# -- item 7: the opt-in is the bool True ------------------------------------------------------------------
@pytest.mark.parametrize("value", ["false", "no", 1, "True", [True]])
def test_trust_remote_artifacts_accepts_only_a_bool(tmp_path, loads, offline_hub, value):
    _hub(offline_hub, "org/warm", b"mega-cache bytes")
    model = tiny_flux_transformer(num_layers=1, num_single_layers=1)
    with pytest.raises(TypeError, match=r"trust_remote_artifacts must be True or False"):
        diffusers_ascend.enable_ascend_compile(model, CFG, cache="org/warm", trust_remote_artifacts=value)
    with pytest.raises(TypeError, match=r"trust_remote_artifacts must be True or False"):
        warm_start.pull_ascend_cache("org/warm", tmp_path / "dst", trust_remote_artifacts=value)
    assert loads == [] and not hasattr(model, "_ascend_state") and not (tmp_path / "dst").exists()
    with pytest.raises(TypeError, match=r"trust_remote_artifacts must be True or False"):
        diffusers_ascend.enable_ascend_compile(model, CFG, trust_remote_artifacts=value)  # without `cache` too
    assert not hasattr(model, "_ascend_state")


# -- item 8: every malformed manifest is a ValueError, every CLI failure a message --------------------------
def _files(m, **entry):
    return {**m, "files": {**m["files"], warm_start.ARTIFACTS_NAME: {**m["files"][warm_start.ARTIFACTS_NAME], **entry}}}


HOSTILE = {
    "size 2**62": lambda m: _files(m, size=2**62),
    "size 10**20": lambda m: _files(m, size=10**20),
    "size -1": lambda m: _files(m, size=-1),
    "size true": lambda m: _files(m, size=True),
    "size 1.5": lambda m: _files(m, size=1.5),
    "files a list": lambda m: {**m, "files": [warm_start.ARTIFACTS_NAME]},
    "blocks a string": lambda m: {**m, "blocks": "ascend_aoti_0.pt2"},
    "format 1, version not a string": lambda m: {"format": 1, "diffusers_ascend": 1},
    "a JSON array": lambda m: [m],
    "nested 100000 deep": lambda m: "[" * 100000 + "]" * 100000,
    "executor not a string": lambda m: {**m, "executor": ["inductor"]},
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_malformed_manifest_is_a_value_error_and_a_cli_message(tmp_path, loads, capsys, name):
    manifest = _write_cache(tmp_path, warm_start.expected_keys(CFG))
    hostile = HOSTILE[name](manifest)
    (tmp_path / warm_start.MANIFEST_NAME).write_text(hostile if isinstance(hostile, str) else json.dumps(hostile))
    with pytest.raises(ValueError, match="ascend_cache.json"):
        warm_start.load_ascend_cache(str(tmp_path), CFG)
    with pytest.raises(ValueError, match="ascend_cache.json"):
        warm_start.cache_info(str(tmp_path))
    assert main(["cache", "info", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("diffusers-ascend cache: error: ") and "ascend_cache.json" in err
    assert loads == []


@pytest.mark.parametrize("size", [2**62, 10**20])
def test_cache_load_and_info_of_an_absurd_size_exit_with_a_message(tmp_path, capsys, size):
    # `cache load` printed a MemoryError (2**62) or OverflowError (10**20) traceback.
    manifest = _write_cache(tmp_path, warm_start.expected_keys(CFG))
    (tmp_path / warm_start.MANIFEST_NAME).write_text(json.dumps(_files(manifest, size=size)))
    assert main(["cache", "load", str(tmp_path)]) == 1
    assert "must be {'sha256'" in capsys.readouterr().err
    r = subprocess.run(
        [sys.executable, "-m", "diffusers_ascend.cli", "cache", "info", str(tmp_path)], capture_output=True, text=True
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr and "must be {'sha256'" in r.stderr, r.stderr[-2000:]


def test_a_size_within_bounds_is_checked_against_the_file_before_reading(tmp_path, loads):
    # 1 TiB claimed for a 16-byte file: refused from the file's size, nothing allocated for it.
    manifest = _write_cache(tmp_path, warm_start.expected_keys(CFG))
    (tmp_path / warm_start.MANIFEST_NAME).write_text(json.dumps(_files(manifest, size=1 << 40)))
    with pytest.raises(ValueError, match="does not match the sha256/size"):
        warm_start.load_ascend_cache(str(tmp_path), CFG)
    assert loads == []


def test_cache_info_of_a_format_1_manifest_reports_it(tmp_path, capsys):
    # An older diffusers-ascend's manifest (no device, no blocks, maybe no executor): a mismatch.
    (tmp_path / warm_start.MANIFEST_NAME).write_text(
        json.dumps({"format": 1, "diffusers_ascend": "0.1.0", "mechanism": "inductor-mega-cache", "files": {}})
    )
    assert main(["cache", "info", str(tmp_path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["matches_here"] is False and info["mismatches"] == [
        "manifest format: saved 1 by diffusers-ascend '0.1.0', here 2"
    ]


# -- item 10 ----------------------------------------------------------------------------------------------
def test_only_this_process_libraries_are_packed(tmp_path, monkeypatch, compiled):
    from torch._inductor.cpu_vec_isa import VecAVX512, VecAVX512VNNI, VecISA

    root = tmp_path / "inductor"
    (root / "ab").mkdir(parents=True)
    # Another process's kernel, written into the shared cache during this process's life.
    (root / "ab" / "cforeign.main.cpp").write_text('extern "C" void kernel() {}')
    (root / "ab" / "cforeign.main.so").write_bytes(b"\x7fELF another process's kernel")
    # A vector-ISA probe: the same build on every process of this machine.
    (root / "cd").mkdir()
    (root / "cd" / "cprobe.cpp").write_text(VecISA._avx_code)
    (root / "cd" / "cprobe.so").write_bytes(b"\x7fELF probe")
    # The probes Inductor builds only on a CPU with AVX-512 BF16 / VNNI (written here, so the test
    # is the same on every CPU): a warm process on such a CPU would build them again.
    (root / "ef").mkdir()
    for name, source in [("cbf16", VecAVX512._avx512_bf16_code), ("cvnni", VecAVX512VNNI._avx512_vnni_code)]:
        (root / "ef" / f"{name}.cpp").write_text(source)
        (root / "ef" / f"{name}.so").write_bytes(b"\x7fELF probe")
    monkeypatch.setattr(_compat, "inductor_cache_dir", lambda: str(root))
    diffusers_ascend.save_ascend_cache(compiled, tmp_path / "cache")
    with tarfile.open(tmp_path / "cache" / warm_start.KERNELS_NAME) as tar:
        assert [m.name for m in tar.getmembers()] == ["cd/cprobe.so", "ef/cbf16.so", "ef/cvnni.so"]


def test_push_refuses_a_directory_that_no_longer_matches_its_manifest(tmp_path, capsys):
    _write_cache(tmp_path, warm_start.expected_keys(CFG))
    (tmp_path / warm_start.ARTIFACTS_NAME).write_bytes(b"mega-cache bytez")  # same size, other bytes
    with (
        mock.patch("huggingface_hub.HfApi.create_repo") as create,
        mock.patch("huggingface_hub.HfApi.create_commit") as commit,
    ):
        assert main(["cache", "push", str(tmp_path), "me/warm"]) == 1
    assert "does not match the sha256/size" in capsys.readouterr().err
    create.assert_not_called()
    commit.assert_not_called()


def test_push_uploads_the_bytes_it_checked(tmp_path):
    _write_cache(tmp_path, warm_start.expected_keys(CFG))
    with mock.patch("huggingface_hub.HfApi.create_repo"), mock.patch("huggingface_hub.HfApi.create_commit") as commit:
        warm_start.push_ascend_cache(tmp_path / warm_start.MANIFEST_NAME, "me/warm")  # the manifest's path works too
    ops = {op.path_in_repo: op.path_or_fileobj for op in commit.call_args.kwargs["operations"]}
    assert ops[warm_start.ARTIFACTS_NAME] == b"mega-cache bytes"
    assert ops[warm_start.MANIFEST_NAME] == (tmp_path / warm_start.MANIFEST_NAME).read_bytes()


def test_the_manifest_path_is_taken_for_its_directory(tmp_path, loads):
    _write_cache(tmp_path, warm_start.expected_keys(CFG))
    model = tiny_flux_transformer(num_layers=1, num_single_layers=1)
    diffusers_ascend.enable_ascend_compile(model, CFG, cache=str(tmp_path / warm_start.MANIFEST_NAME))
    assert loads == [b"mega-cache bytes"]
    with pytest.raises(ValueError, match="is a file: pass the directory"):
        diffusers_ascend.enable_ascend_compile(model, CFG, cache=str(tmp_path / warm_start.ARTIFACTS_NAME))


def test_cache_info_of_an_unknown_executor_reports_a_mismatch(tmp_path, capsys):
    _write_cache(tmp_path, {**warm_start.expected_keys(CFG), "executor": "tensorrt"})
    assert main(["cache", "info", str(tmp_path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["mismatches"] == ["executor: saved 'tensorrt', here 'inductor'"]
