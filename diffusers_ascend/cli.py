"""The ``diffusers-ascend`` command: ``env``, ``demo``, ``bench`` (``bench e2e``, ``bench kernels``...), ``config`` and ``cache``.

Exit codes: 0 success, 1 the command ran and failed (invalid config, failed check, a benchmark
variant that failed), 2 usage errors (argparse: unknown commands, bad choices, numbers that are not
positive integers, unknown fusion names), 130 interrupted (Ctrl-C: one line, no traceback).
``--json`` prints one JSON document on stdout instead of text; errors go to stderr as one line,
never a traceback.

>>> from diffusers_ascend.cli import build_parser
>>> build_parser().parse_args(["config", "validate", "ascend_config.json"]).file
'ascend_config.json'
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.metadata
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from .benchmarks.registry import multiple_of_16 as _height
from .benchmarks.registry import positive_int as _positive_int
from .platform import PLATFORMS  # stdlib only: `--help` stays free of torch

__all__ = ["build_parser", "main"]


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _print(obj: Any, as_json: bool, text: str) -> None:
    print(json.dumps(obj, indent=2, default=str) if as_json else text)


# -- env -----------------------------------------------------------------------------------------
def _cann_version() -> str | None:
    # CANN writes its version next to the toolkit; ASCEND_TOOLKIT_HOME is set by its set_env.sh.
    home = os.environ.get("ASCEND_TOOLKIT_HOME") or "/usr/local/Ascend/ascend-toolkit/latest"
    for name in ("version.cfg", "version.info"):
        path = os.path.join(home, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                for line in f:
                    if "version" in line.lower() and "=" in line:
                        return line.split("=", 1)[1].strip()
    return None


def env_info() -> dict[str, Any]:
    """What will run where on this machine: versions, device, op providers, resolved defaults.

    Works without torch_npu (and with a broken one: the import error is reported, not raised).

    >>> info = env_info()
    >>> info["platform"] in ("cpu", "cuda", "npu") and "providers" in info
    True
    """
    import torch

    import ascend_kernels
    from ascend_kernels.npu import mindiesd_unavailable_reason
    from ascend_kernels.npu.attention import describe as describe_fia
    from ascend_kernels.registry import explain

    from . import _diffusers_compat
    from .attention.npu_fia import fallbacks
    from .compilation._compat import support_status, supported_range, torch_version
    from .config import AscendConfig
    from .platform import platform_info

    plat = platform_info()
    cfg = AscendConfig()
    mindiesd_why = mindiesd_unavailable_reason()
    npu_version = _version("torch_npu")
    chosen = {op: explain(op, plat["platform"]) for op in ascend_kernels.OPS}
    return {
        "diffusers_ascend": _version("diffusers-ascend"),
        "torch": torch.__version__,
        "torch_supported_range": supported_range(),
        "torch_status": support_status()[0],
        "diffusers": _version("diffusers"),
        "diffusers_range": _diffusers_compat.supported_range(),
        "diffusers_status": _diffusers_compat.support_status(_version("diffusers") or "0")[0],
        "torch_npu": (npu_version or "installed (version unknown)") if plat["torch_npu_installed"] else None,
        # torch_npu wheels are built per torch release: 2.8.0.post2 pairs with torch 2.8.
        "torch_npu_matches_torch": (torch_version(npu_version) == torch_version()) if npu_version else None,
        "torch_npu_error": plat["torch_npu_error"],
        "cann": _cann_version(),
        # MindIE SD's op plugin imports only on the torch releases it was built for: a reason, not an error.
        "mindiesd": (
            f"{_version('mindiesd') or 'installed'}: torch.ops.mindiesd.adaln registered"
            if mindiesd_why is None
            else f"unavailable, because {mindiesd_why}"
        ),
        "triton": _version("triton") or _version("triton-ascend"),
        "platform": plat["platform"],
        "platform_overridden": plat["overridden"],
        "providers": {op: name for op, (name, _) in chosen.items()},
        "provider_reasons": {op: why for op, (_, why) in chosen.items()},
        "auto_fusions": list(cfg.resolved_fusions()),
        "auto_executor": cfg.resolved_executor(),
        "attention_backend": cfg.resolved_attention() or "unchanged (diffusers default)",
        "attention_with_capture": (
            cfg.replace(graph_capture="graph_with_compile").resolved_attention() or "unchanged (diffusers default)"
        ),
        "npu_fia": describe_fia(),
        "npu_fia_fallbacks": fallbacks(),
        "graph_capture_supported": plat["graph_capture_supported"],
    }


def _cmd_env(args) -> int:
    from ._diffusers_compat import support_status as diffusers_support_status
    from .compilation._compat import support_status

    info = env_info()
    rows = [(k, v if not isinstance(v, dict) else "") for k, v in info.items()]
    text = "\n".join(
        f"{k:<24}{'-' if v is None else v}"
        for k, v in rows
        if k not in ("providers", "provider_reasons", "npu_fia_fallbacks")
    )
    if info["npu_fia_fallbacks"]:
        text += "\nnpu_fia calls FIA could not take (reason -> fallback: calls):\n" + "\n".join(
            f"  {why}: {n}" for why, n in info["npu_fia_fallbacks"].items()
        )
    text += "\nproviders (op -> provider a typical call uses here: why):\n" + "\n".join(
        f"  {op:<22}{p:<8}{info['provider_reasons'][op]}" for op, p in info["providers"].items()
    )
    if info["torch_status"] != "supported":
        text += f"\nwarning: {support_status()[1]}"
    if info["diffusers_status"] != "supported":
        text += f"\nwarning: {diffusers_support_status(info['diffusers'] or '(not installed)')[1]}"
    if info["torch_npu_matches_torch"] is False:
        text += f"\nwarning: torch_npu {info['torch_npu']} was built for another torch than {info['torch']}: install the pair."
    if info["torch_npu_error"]:
        text += f"\nnote: torch_npu failed to import ({info['torch_npu_error']}); falling back to {info['platform']}."
    elif info["torch_npu"] is None:
        text += "\nnote: torch_npu is not installed: the native (PyTorch) providers run; install diffusers-ascend[npu] on an Ascend host."
    _print(info, args.json, text)
    return 0


# -- demo ----------------------------------------------------------------------------------------
def _latency(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


@contextlib.contextmanager
def _quiet_libraries():
    """diffusers/transformers warnings and progress bars off for the demo, restored afterwards.

    save_pretrained of a pipeline without text encoders warns once per None component, loading
    shows a progress bar and transformers notes a missing torchvision: none of it is the demo's.
    """
    from diffusers.utils import logging as dlog

    restore = [functools.partial(dlog.set_verbosity, dlog.get_verbosity())]
    if dlog.is_progress_bar_enabled():
        restore.append(dlog.enable_progress_bar)
    dlog.set_verbosity_error()
    dlog.disable_progress_bar()
    try:
        from transformers.utils import logging as tlog
    except ImportError:  # diffusers works without transformers (the tiny pipelines need none)
        tlog = None
    if tlog is not None:
        restore.append(functools.partial(tlog.set_verbosity, tlog.get_verbosity()))
        tlog.set_verbosity_error()
    try:
        yield
    finally:
        for undo in restore:
            undo()


def _tiny(model: str, height: int):
    from . import tiny

    if model == "flux":
        pipe = tiny.tiny_flux_pipeline()
        inputs = lambda: tiny.flux_pipeline_inputs(height=height, width=height)  # noqa: E731
        return pipe, inputs, "images", dict(tiny.FLUX_RELOAD_KWARGS)
    pipe = tiny.tiny_wan_pipeline()
    inputs = lambda: tiny.wan_pipeline_inputs(height=height, width=height)  # noqa: E731
    return pipe, inputs, "frames", dict(tiny.WAN_RELOAD_KWARGS)


def _real(model_id: str, device: str, height: int, steps: int, prompt: str):
    import torch
    from diffusers import DiffusionPipeline

    from .platform import prepare_device

    prepare_device(device)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    pipe = DiffusionPipeline.from_pretrained(model_id, torch_dtype=dtype, ascend_config=False).to(device)
    out_attr = "frames" if "Wan" in type(pipe).__name__ else "images"

    def inputs():
        return dict(
            prompt=prompt,
            height=height,
            width=height,
            num_inference_steps=steps,
            generator=torch.Generator("cpu").manual_seed(0),
            output_type="pt",
        )

    return pipe, inputs, out_attr, {"torch_dtype": dtype}


def run_demo(
    model: str = "flux",
    model_id: str | None = None,
    device: str = "cpu",
    fusions: Any = "all",
    executor: str = "auto",
    height: int | None = None,
    steps: int = 2,
    repeats: int = 3,
    prompt: str = "a photo of an astronaut riding a horse",
    progress: bool = True,
    save_dir: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Runs a pipeline eager and with `enable_ascend_compile`, then saves, reloads and compares.

    Args:
        model: ``"flux"`` or ``"wan"``: the embedded tiny pipeline (seeded random weights, no download).
        model_id: a Hub id or local folder with real weights instead of the tiny pipeline.
        device: where a `model_id` pipeline runs (``"npu"``, ``"cuda"``, ``"cpu"``).
        fusions / executor: passed to `enable_ascend_compile`.
        height: image height and width in pixels (default 32 for the tiny pipelines, 512 for `model_id`).
        steps: denoising steps per call.
        repeats: calls timed per variant (median reported).
        progress: show a progress bar over the stages.
        save_dir: where the accelerated pipeline is saved and kept; None saves it into a temporary
            folder, removed after the reload.

    Returns:
        dict with ``report`` (FusionReport.to_dict), ``per_block`` rows, ``compile_s``,
        ``eager_s``, ``accelerated_s``, ``max_abs_diff``, ``config``, ``reloaded_config``,
        ``round_trip_ok``, ``saved_to`` (the folder), ``kept`` (whether it still exists) and
        ``reload`` (the ``from_pretrained`` call that reloads it: the tiny pipelines have no text
        encoders, so it passes ``text_encoder=None, ...``).

    Raises:
        ValueError: a bad argument, or a `save_dir` that cannot be written; before any work.

    >>> r = run_demo(executor="eager", repeats=1, progress=False)  # doctest: +SKIP
    """
    from .config import AscendConfig

    # Bad arguments fail here, before minutes of eager runs.
    if model_id is None and model not in ("flux", "wan"):
        raise ValueError(f"model={model!r} is not an embedded tiny pipeline; valid: 'flux', 'wan'")
    AscendConfig(fusions=fusions, executor=executor)
    for name, value in (("steps", steps), ("repeats", repeats), ("height", height)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if save_dir is not None:
        from .benchmarks._common import check_out_dir

        save_dir = check_out_dir(save_dir)
    with _quiet_libraries():
        return _run_demo(model, model_id, device, fusions, executor, height, steps, repeats, prompt, progress, save_dir)


def _enabled_config(pipe) -> Any:
    """The `AscendConfig` the pipeline's transformer was enabled with."""
    from .integration import enabled_models

    return next(m.config for m in enabled_models(pipe) if m.name == "transformer")


def _reload_call(cls: type, path: str, kwargs: dict[str, Any]) -> str:
    """The ``from_pretrained`` call that reloads the saved pipeline, as code."""
    args = "".join(f", {k}={v}" for k, v in kwargs.items())  # None, torch.bfloat16: reprs that are code
    return f"{cls.__module__.split('.')[0]}.{cls.__name__}.from_pretrained({path!r}{args})"


def _run_demo(model, model_id, device, fusions, executor, height, steps, repeats, prompt, progress, save_dir):
    import torch
    from tqdm.auto import tqdm

    from .config import AscendConfig
    from .platform import current_platform

    stages = tqdm(total=6, desc="demo", disable=not progress, file=sys.stderr)

    def stage(desc):
        stages.set_postfix_str(desc)
        stages.update(1)

    if model_id:
        pipe, inputs, out_attr, reload_kwargs = _real(model_id, device, height or 512, steps, prompt)
    else:
        pipe, inputs, out_attr, reload_kwargs = _tiny(model, height or 32)
    pipe.set_progress_bar_config(disable=True)
    run = lambda p: getattr(p(**inputs()), out_attr)  # noqa: E731
    with torch.no_grad():
        ref = run(pipe)
        eager_s = _latency(lambda: run(pipe), repeats)
        stage("eager")
        pipe.enable_ascend_compile(fusions=fusions, executor=executor)
        t = time.perf_counter()
        out = run(pipe)  # first call compiles every block class
        compile_s = time.perf_counter() - t
        stage("compile")
        accel_s = _latency(lambda: run(pipe), repeats)
        stage("accelerated")
    report = pipe.ascend_report()
    diff = (out.float() - ref.float()).abs().max().item()
    config = _enabled_config(pipe)
    with contextlib.ExitStack() as stack:
        folder = (
            save_dir
            if save_dir is not None
            else stack.enter_context(tempfile.TemporaryDirectory(prefix="diffusers-ascend-demo-"))
        )
        pipe.save_pretrained(folder)
        stage("saved")
        loaded = type(pipe).from_pretrained(folder, **reload_kwargs)
        stage("reloaded")
        reloaded = _enabled_config(loaded)
    per_block = []
    for g in report.graphs:
        label = g.name.split(":")[0]
        per_block.append(
            {"block": label, "graph": g.name, **g.matches, "ops_before": g.ops_before, "ops_after": g.ops_after}
        )
    stage("done")
    stages.close()
    return {
        "model": model_id or f"tiny-{model}",
        "platform": current_platform(),
        "config": config.to_dict(),
        "report": report.to_dict(),
        "per_block": per_block,
        "swaps": dict(report.swaps),
        "compile_s": compile_s,
        "eager_s": eager_s,
        "accelerated_s": accel_s,
        "max_abs_diff": diff,
        "reloaded_config": reloaded.to_dict(),
        "round_trip_ok": reloaded == config and isinstance(reloaded, AscendConfig),
        "saved_to": folder,
        "kept": save_dir is not None,
        "reload": _reload_call(type(pipe), folder, reload_kwargs),
    }


def _table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(no compiled graphs)"
    cols = list(dict.fromkeys(k for r in rows for k in r))
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols}
    lines = ["  ".join(c.ljust(widths[c]) for c in cols)]
    lines += ["  ".join(str(r.get(c, "")).ljust(widths[c]) for c in cols) for r in rows]
    return "\n".join(lines)


def _cmd_demo(args) -> int:
    result = run_demo(
        model=args.model,
        model_id=args.model_id,
        device=args.device,
        fusions=args.fusions,
        executor=args.executor,
        height=args.height,
        steps=args.steps,
        repeats=args.repeats,
        progress=not args.json,
        save_dir=args.save_dir,
    )
    r = result
    text = "\n".join(
        [
            f"model: {r['model']}   fusions: {r['config']['fusions']}   executor: {args.executor}",
            "",
            "fusion report per compiled block class (pattern matches; ops = operator calls in the graph the backend",
            "receives, i.e. after the layer swaps, before/after its passes):",
            _table(r["per_block"]),
            f"layer swaps (fused modules swapped in before compiling): {r['swaps'] or 'none'}",
            "",
            f"compile (first accelerated call): {r['compile_s']:.2f} s",
            f"steady-state latency: eager {r['eager_s'] * 1e3:.1f} ms, accelerated {r['accelerated_s'] * 1e3:.1f} ms "
            f"({r['eager_s'] / r['accelerated_s']:.2f}x)"
            + (
                "  [on CPU the fused ops run their PyTorch reference composites: the speed-up needs NPU kernels]"
                if r["platform"] == "cpu"
                else ""
            ),
            f"max |accelerated - eager|: {r['max_abs_diff']:.2e}",
            f"saved + reloaded: config round-tripped {'OK' if r['round_trip_ok'] else 'MISMATCH'}: {json.dumps(r['reloaded_config'])}",
            f"saved to {r['saved_to']}"
            + (" (kept)" if r["kept"] else " (a temporary folder, now removed; --save-dir DIR keeps it)"),
            f"reloaded with: {r['reload']}",
        ]
    )
    _print(result, args.json, text)
    return 0 if r["round_trip_ok"] else 1


# -- bench ---------------------------------------------------------------------------------------
def _cmd_bench(args) -> int:
    import importlib
    import importlib.util

    from .benchmarks.registry import REGISTRY

    if getattr(args, "out", None) is not None:  # a bad folder is found now, not after the whole run
        from .benchmarks._common import check_out_dir

        check_out_dir(args.out)
    command = getattr(args, "bench_command", None)  # None: the suite
    if (REGISTRY[command].plots if command else True) and importlib.util.find_spec("matplotlib") is None:
        # checked before minutes of benchmarking
        raise ImportError(
            f"diffusers-ascend bench{' ' + command if command else ''} writes a PNG plot and needs "
            "matplotlib: pip install 'diffusers-ascend[bench]'"
        )
    if command is not None:
        return importlib.import_module(f"{__package__}.benchmarks.{REGISTRY[command].module}").cli(args)

    from .benchmarks import run_benchmarks

    options = {"compile_time": {"executors": args.executors}} if args.executors else None
    results = run_benchmarks(names=args.only or None, size=args.size, out_dir=args.out, options=options)
    if args.json:
        print(json.dumps(results, indent=2, default=str))
    else:
        print(f"wrote {os.path.join(args.out, 'results.json')}, results.md and results.png")
    return 0


# -- config --------------------------------------------------------------------------------------
_EXPECTED = (
    "an ascend_config.json (AscendConfig fields), or a model's config.json / a pipeline's model_index.json "
    "holding the settings enable_ascend_compile saved (`_ascend_config`)"
)


class _NoSettings(ValueError):
    """A JSON object that holds no ascend settings (in a folder, another file may)."""


def _config_in_file(path: str):
    """The `AscendConfig` a JSON file holds: an ``ascend_config.json``, or the settings saved under
    ``_ascend_config`` in a diffusers ``config.json`` / ``model_index.json``. Anything else is a
    ``ValueError`` naming what was expected (loading it as an ascend config would warn about every
    key and answer the defaults)."""
    from dataclasses import fields

    from ._diffusers_compat import is_diffusers_config
    from .config import AscendConfig, read_json_object
    from .integration import ASCEND_CONFIG_KEY

    data = read_json_object(path, _EXPECTED)
    if ASCEND_CONFIG_KEY in data:
        saved = data[ASCEND_CONFIG_KEY]
        if saved is None or saved == {}:
            raise _NoSettings(
                f"{path} holds no saved ascend settings (`{ASCEND_CONFIG_KEY}` is {json.dumps(saved)}: "
                "acceleration was disabled before saving)"
            )
        return AscendConfig.from_dict(saved, source=f"`{ASCEND_CONFIG_KEY}` in {path}")
    if is_diffusers_config(data):
        raise _NoSettings(
            f"{path} is a diffusers config without saved ascend settings (no `{ASCEND_CONFIG_KEY}` "
            "key: it was saved without enable_ascend_compile); expected " + _EXPECTED
        )
    known = {f.name for f in fields(AscendConfig)} | {"version", "diffusers_ascend_version"}
    if not set(data) & known:
        keys = sorted(map(str, data))
        raise _NoSettings(
            f"{path} holds neither an ascend config nor saved ascend settings (its keys: "
            f"{', '.join(keys[:8]) + (', ...' if len(keys) > 8 else '') or 'none'}); expected " + _EXPECTED
        )
    return AscendConfig.from_dict(data, source=path)


def _load_config(source: str | None):
    from .config import CONFIG_NAME, AscendConfig

    if source is None:
        return AscendConfig()
    if os.path.isfile(source):
        return _config_in_file(source)
    if os.path.isdir(source):
        # A folder of save_pretrained: its ascend_config.json, else the settings a saved model or
        # pipeline keeps under `_ascend_config` (the model's config, then the pipeline's).
        for name in (CONFIG_NAME, "config.json", os.path.join("transformer", "config.json"), "model_index.json"):
            path = os.path.join(source, name)
            if os.path.isfile(path):
                try:
                    return _config_in_file(path)
                except _NoSettings:
                    continue
        raise ValueError(
            f"{source} holds no ascend settings: looked for {CONFIG_NAME}, and `_ascend_config` in "
            "config.json, transformer/config.json and model_index.json"
        )
    return AscendConfig.from_pretrained(source)


def _cmd_config(args) -> int:
    import warnings

    from .config import AscendConfig
    from .errors import PREFIX

    if args.action == "show":
        cfg = _load_config(args.source)
        info = {
            "config": cfg.to_dict(),
            "resolved_fusions": list(cfg.resolved_fusions()),
            "resolved_executor": cfg.resolved_executor(),
            "cache_key": cfg.cache_key(),
        }
        text = cfg.to_json_string() + (
            f"\non this machine: fusions {list(cfg.resolved_fusions())}, executor {cfg.resolved_executor()!r}"
        )
        _print(info, args.json, text)
        return 0
    if args.action == "validate":
        try:
            with warnings.catch_warnings(record=True) as caught:  # reported with the verdict
                warnings.simplefilter("always")
                cfg = _load_config(args.file)
        except Exception as e:  # every way a file can be wrong ends here with its message
            if args.json:  # the one JSON document, on stdout as always
                _print({"valid": False, "error": f"{type(e).__name__}: {e}"}, True, "")
            else:
                print(f"invalid: {args.file}: {e}", file=sys.stderr)
            return 1
        notes = [str(w.message).removeprefix(PREFIX) for w in caught]  # under our own "warning:" label
        _print(
            {"valid": True, "config": cfg.to_dict(), "warnings": notes},
            args.json,
            "\n".join([f"valid: {args.file}", *(f"  warning: {n}" for n in notes)]),
        )
        return 0
    if args.action == "push":
        cfg = _load_config(args.dir)
        url = cfg.push_to_hub(args.repo_id, private=args.private, token=args.token)
        _print({"repo_id": args.repo_id, "url": str(url)}, args.json, f"pushed to {args.repo_id}: {url}")
        return 0
    if args.action == "pull":
        cfg = AscendConfig.from_pretrained(args.repo_id, revision=args.revision, token=args.token)
        path = cfg.save_pretrained(args.dir)
        _print({"path": str(path), "config": cfg.to_dict()}, args.json, f"saved {args.repo_id} to {path}")
        return 0
    raise AssertionError(args.action)


# -- cache ---------------------------------------------------------------------------------------
def _cache_pipeline(args):
    height = args.height or (32 if args.model_id is None else 512)
    if args.model_id is None:
        pipe, inputs, _, _ = _tiny(args.model, height)
    else:
        pipe, inputs, _, _ = _real(args.model_id, args.device, height, args.steps, "a photo of an astronaut")
    return pipe, lambda: {**inputs(), "num_inference_steps": args.steps}


def _cmd_cache(args) -> int:
    if args.action not in ("info", "push", "pull"):
        return _cache_run(args)
    try:
        return _cache_files(args)
    except (ValueError, TypeError, OSError, ImportError):
        raise  # main's message
    except Exception as e:  # noqa: BLE001 - these read and write data only: any failure is a message
        print(f"diffusers-ascend cache {args.action}: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


def _cache_files(args) -> int:
    from . import warm_start

    if args.action == "info":
        info = warm_start.cache_info(args.source, revision=args.revision, token=args.token)
        where = args.source + (f"@{args.revision}" if args.revision else "")
        _print(info, args.json, _cache_info_text(where, info))
        return 0
    if args.action == "push":
        url = warm_start.push_ascend_cache(args.dir, args.repo_id, private=args.private, token=args.token)
        _print({"repo_id": args.repo_id, "url": str(url)}, args.json, f"pushed {args.dir} to {args.repo_id}: {url}")
        return 0
    if args.action == "pull":
        manifest = warm_start.pull_ascend_cache(
            args.repo_id,
            args.dir,
            trust_remote_artifacts=args.trust_remote_artifacts,
            revision=args.revision,
            token=args.token,
        )
        _print(
            {"path": args.dir, "manifest": manifest},
            args.json,
            f"saved {args.repo_id}'s compile artifacts to {args.dir}",
        )
        return 0
    raise AssertionError(args.action)


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError


def _cache_info_text(where: str, info: dict[str, Any]) -> str:
    """A few lines of `warm_start.cache_info`: what, where, built with what, sizes, packages, fit."""
    lines = [
        f"compile artifacts at {where}: manifest format {info['format']}"
        + (f" ({info['mechanism']})" if "mechanism" in info else "")
    ]
    if "torch" in info:
        lines.append(
            f"built by diffusers-ascend {info['diffusers_ascend']} with torch {info['torch']}, Python "
            f"{info['python']}, for {info['platform']} on {info['machine']} (device {info['device']}), "
            f"executor {info['executor']}"
        )
        files = info["files"]
        lines.append(f"files ({len(files)}, {_size(sum(f['size'] for f in files.values()))} in all):")
        width = max(map(len, files))
        lines += [f"  {name:<{width}}  {_size(f['size']):>9}" for name, f in files.items()]
        lines.append(f"block packages (AOTInductor, one per block class and call shape): {len(info['blocks'])}")
        for b in info["blocks"]:
            fused = ", ".join(f"{k} {n}" for k, n in b["matches"].items() if n) or "none"
            lines.append(
                f"  {b['model']}.{b['class']}  {b['file']}  ops {b['ops_before']} -> {b['ops_after']}, fusions: {fused}"
            )
    else:
        lines.append(f"written by diffusers-ascend {info['diffusers_ascend']}")
    if info["matches_here"]:
        lines.append("fits this machine: yes (torch, platform, device, Python, diffusers-ascend and executor match)")
    else:
        lines.append("fits this machine: no; it would be ignored (compiled afresh) because of:")
        lines += [f"  {m}" for m in info["mismatches"]]
    lines.append("(--json prints the whole manifest: hashes, call signatures)")
    return "\n".join(lines)


def _cache_run(args) -> int:
    import time

    import torch

    from .compilation._compat import compile_cache_counters
    from .integration import enable_ascend_compile, package_counters, save_ascend_cache

    pipe, inputs = _cache_pipeline(args)
    pipe.set_progress_bar_config(disable=True)
    source = args.source if args.action == "load" else None
    start = time.perf_counter()
    enable_ascend_compile(
        pipe,
        fusions=args.fusions,
        executor="inductor",
        cache=source,
        trust_remote_artifacts=getattr(args, "trust_remote_artifacts", False),
    )
    with _quiet_libraries(), torch.no_grad():
        pipe(**inputs())
    info = {
        "first_call_s": round(time.perf_counter() - start, 3),
        **compile_cache_counters(),
        **{f"package_{k}": v for k, v in package_counters(pipe).items()},
    }
    if args.action == "save":
        info["manifest"] = save_ascend_cache(pipe, args.dir)
        text = (
            f"compiled in {info['first_call_s']} s; saved the artifacts ({len(info['manifest']['blocks'])} block "
            f"packages) to {args.dir}"
        )
    else:
        text = (
            f"first call {info['first_call_s']} s; {info['package_packages']} block packages ran "
            f"{info['package_calls']} calls ({info['package_passed_on']} passed on to the compiler); "
            f"AOTAutograd cache {info['autograd_cache_hit']} hits / {info['autograd_cache_miss']} misses, "
            f"FX graph cache {info['fxgraph_cache_hit']} hits / {info['fxgraph_cache_miss']} misses"
        )
    _print(info, args.json, text)
    return 0


# -- parser --------------------------------------------------------------------------------------
def _fusions(text: str):
    from .config import _normalize_fusions

    value = text.strip()  # "rms_norm,rope": AscendConfig reads the comma-separated names
    try:
        _normalize_fusions(value)
    except (TypeError, ValueError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of ``diffusers-ascend`` (exposed for tests and docs)."""
    parser = argparse.ArgumentParser(
        prog="diffusers-ascend", description="Run diffusers pipelines fast on Ascend NPUs."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{env,demo,bench,config,cache}")

    def add(name, help_, func, json_flag=True):
        p = sub.add_parser(name, help=help_, description=help_)
        if json_flag:  # `config` puts it on its actions: a parent's flag would be reset by theirs
            p.add_argument("--json", action="store_true", help="print one JSON document instead of text")
        p.set_defaults(func=func)
        return p

    add("env", "versions, device, op providers and what 'auto' picks on this machine", _cmd_env)

    demo = add("demo", "run a tiny pipeline (no download) eager and accelerated, then save and reload it", _cmd_demo)
    demo.add_argument("--model", choices=("flux", "wan"), default="flux", help="embedded tiny pipeline (default flux)")
    demo.add_argument("--model-id", help="Hub id or folder with real weights instead of the tiny pipeline")
    demo.add_argument("--device", choices=PLATFORMS, default="cpu", help="device for --model-id")
    demo.add_argument(
        "--fusions", type=_fusions, default="all", help="auto | all | none | comma-separated names (default all)"
    )
    demo.add_argument(
        "--executor",
        choices=("auto", "eager", "inductor"),
        default="eager",
        help="eager: rewritten graph op by op (fast to compile; NPU default); auto: per platform",
    )
    demo.add_argument(
        "--height",
        type=_height,
        help="image height and width in pixels, a multiple of 16 (default 32 tiny, 512 with --model-id)",
    )
    demo.add_argument("--steps", type=_positive_int, default=2, help="denoising steps per call (default 2)")
    demo.add_argument(
        "--repeats", type=_positive_int, default=3, help="timed calls per variant, median reported (default 3)"
    )
    demo.add_argument(
        "--save-dir",
        metavar="DIR",
        help="save the accelerated pipeline here and keep it (default: a temporary folder, removed)",
    )

    bench = add("bench", "run the benchmarks; write results.json, results.md and results.png", _cmd_bench)
    bench.add_argument(
        "--only", nargs="+", metavar="NAME", help=f"benchmarks to run, of {', '.join(_suite_names())} (default: all)"
    )
    bench.add_argument("--size", default="small", help="problem size: tiny (seconds) or small (default)")
    bench.add_argument("--out", default="bench-results", help="output folder (default bench-results)")
    bench.add_argument(
        "--executors",
        nargs="+",
        choices=("eager", "inductor"),
        help="compile_time: the executors measured (default: the size's preset)",
    )
    _add_bench_parsers(bench)

    config = add("config", "show, validate, push or pull an ascend_config.json", _cmd_config, json_flag=False)
    actions = config.add_subparsers(dest="action", required=True, metavar="{show,validate,push,pull}")
    show = actions.add_parser(
        "show", help="print a config (defaults, a JSON file, a folder or a Hub repo) and what it resolves to here"
    )
    show.add_argument(
        "source",
        nargs="?",
        help="ascend_config.json, a saved model's config.json or model_index.json, "
        "a saved pipeline/model folder, or a Hub repo id",
    )
    validate = actions.add_parser(
        "validate", help="check a config (as `show` takes it); exit 1 with the reason if invalid"
    )
    validate.add_argument(
        "file",
        metavar="source",
        help="ascend_config.json, a saved model's config.json or model_index.json, a saved "
        "pipeline/model folder, or a Hub repo id",
    )
    push = actions.add_parser("push", help="upload the config of DIR to a Hub repo")
    push.add_argument("dir")
    push.add_argument("repo_id")
    push.add_argument("--private", action="store_true")
    push.add_argument("--token")
    pull = actions.add_parser("pull", help="download a Hub repo's ascend_config.json into DIR")
    pull.add_argument("repo_id")
    pull.add_argument("dir")
    pull.add_argument("--revision")
    pull.add_argument("--token")
    for p in (show, validate, push, pull):
        p.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    _add_cache_parser(add)
    return parser


def _suite_names() -> list[str]:
    from .benchmarks.registry import REGISTRY

    return [b.name for b in REGISTRY.values() if b.function is not None]


def _add_bench_parsers(bench) -> None:
    # `bench <name>`: every registry entry that is no suite member, its help and flags the registry's.
    from .benchmarks.registry import REGISTRY

    commands = [b for b in REGISTRY.values() if b.function is None]
    sub = bench.add_subparsers(dest="bench_command", metavar="{" + ",".join(b.name for b in commands) + "}")
    for b in commands:
        b.arguments(sub.add_parser(b.name, help=b.help, description=b.description or b.help))


def _add_cache_parser(add) -> None:
    cache = add(
        "cache",
        "save, load, push, pull or inspect compile artifacts (warm start, docs/warm-start.md)",
        _cmd_cache,
        json_flag=False,
    )
    actions = cache.add_subparsers(dest="action", required=True, metavar="{save,load,push,pull,info}")
    save = actions.add_parser(
        "save",
        help="compile a pipeline (tiny, or --model-id) once with executor=inductor and save its artifacts to DIR",
    )
    save.add_argument("dir")
    load = actions.add_parser(
        "load", help="run a pipeline once with the artifacts of SOURCE (folder or Hub repo) and report the cache hits"
    )
    load.add_argument("source")
    load.add_argument(
        "--trust-remote-artifacts",
        action="store_true",
        help="allow a Hub repo: its artifacts contain compiled code that runs in this process",
    )
    for p in (save, load):
        p.add_argument("--model", choices=("flux", "wan"), default="flux", help="embedded tiny pipeline (default flux)")
        p.add_argument("--model-id", help="Hub id or folder with real weights instead of the tiny pipeline")
        p.add_argument("--device", choices=PLATFORMS, default="cpu", help="device for --model-id")
        p.add_argument("--fusions", type=_fusions, default="all", help="auto | all | none | comma-separated names")
        p.add_argument("--height", type=_height, help="a multiple of 16 (default 32 tiny, 512 with --model-id)")
        p.add_argument("--steps", type=_positive_int, default=1, help="denoising steps of the call (default 1)")
    push = actions.add_parser("push", help="upload the artifacts of DIR to a Hub repo (next to ascend_config.json)")
    push.add_argument("dir")
    push.add_argument("repo_id")
    push.add_argument("--private", action="store_true")
    pull = actions.add_parser("pull", help="download a Hub repo's artifacts into DIR (needs --trust-remote-artifacts)")
    pull.add_argument("repo_id")
    pull.add_argument("dir")
    pull.add_argument(
        "--trust-remote-artifacts", action="store_true", help="required: the artifacts contain compiled code"
    )
    info = actions.add_parser(
        "info", help="print the manifest of a folder or Hub repo and whether it fits this machine"
    )
    info.add_argument("source")
    for p in (pull, info):
        p.add_argument("--revision")
    for p in (save, load, push, pull, info):
        p.add_argument("--json", action="store_true", help="print one JSON document instead of text")
        if p in (push, pull, info):
            p.add_argument("--token")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``diffusers-ascend`` console script; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError, OSError, ImportError) as e:  # bad input or setup: a clear message, no traceback
        print(f"diffusers-ascend {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C: the shell's convention, 128 + SIGINT
        print(f"\ndiffusers-ascend {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
