"""Benchmark `e2e`: a real-size transformer through the stock pipeline's denoising loop, per variant.

The model's real transformer config is shipped as data (``configs/<model>.json``, with the source
of every value), so nothing is downloaded: the weights are random, created directly on the device
in the model's dtype, drawn from a seeded local generator. The timed loop is the stock diffusers
pipeline's own ``__call__`` (`FluxPipeline`, `WanPipeline`, `QwenImagePipeline` with the model's
scheduler) given prompt embeddings of the right shapes: it leaves out the text encoders and the
VAE decode (``output_type="latent"``), and keeps everything in between (latent preparation,
timesteps, classifier-free guidance where the pipeline runs it, the scheduler steps).

Each variant runs on the same model in its own compile state (enabled, run, disabled, dynamo
reset): ``eager`` as users run diffusers there (``_native_npu`` attention on NPU), ``ascend``
(``enable_ascend_compile(fusions="auto")``), ``ascend+graph`` (the same plus
``graph_capture="graph_with_compile"``), ``regional`` (diffusers' ``compile_repeated_blocks``),
``ascend-by-name`` (the same call with ``backend="ascend"``: our backend by name, as a stack that
picks backends by name runs it; docs/named-backend.md) and ``mindiesd`` (MindIE SD's backend as cache-dit uses it: the whole transformer,
``dynamic=True``). A variant that cannot exist on the machine is listed as skipped, with why.

>>> from diffusers_ascend.benchmarks.bench_e2e import run_e2e
>>> result = run_e2e("wan", depth=1, height=16, width=16, frames=1, steps=2, text_len=8,
...                  variants=["eager"], progress=False)  # doctest: +SKIP
>>> [v["name"] for v in result["variants"]]  # doctest: +SKIP
['eager']
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ._common import (
    check_out_dir,
    cold_compile,
    error_line,
    machine_info,
    markdown_table,
    register_ops,
    synchronize,
    text_table,
    warm_up_compiler,
)

MODELS = ("flux", "wan", "wan-14b", "qwen-image")
VARIANTS = ("eager", "ascend", "ascend+graph", "regional", "ascend-by-name", "mindiesd")
DEVICES = ("cpu", "cuda", "npu")
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
# torchao's int8 schemes (`--quant`): the transformer's linears quantized after the float reference ran.
QUANTS = ("int8-dynamic", "int8-weight")

LEAVES_OUT = (
    "text encoders (prompt embeddings of the right shapes are passed in)",
    "VAE decode (output_type='latent')",
)

# The classes a shipped config may name: a config is data, never a path to arbitrary code.
_CLASSES = {
    "FluxTransformer2DModel",
    "WanTransformer3DModel",
    "QwenImageTransformer2DModel",
    "FluxPipeline",
    "WanPipeline",
    "QwenImagePipeline",
    "FlowMatchEulerDiscreteScheduler",
    "UniPCMultistepScheduler",
}
_SPEC_KEYS = {
    "name",
    "title",
    "repo",
    "transformer_class",
    "transformer",
    "transformer_source",
    "depth_keys",
    "pipeline_class",
    "scheduler_class",
    "scheduler",
    "scheduler_source",
    "job",
    "job_notes",
    "anchors",
}

COLUMNS = [
    ("name", "variant"),
    ("status", "status"),
    ("cold_s", "cold s"),
    ("step_ms", "step ms"),
    ("e2e_s", "e2e s"),
    ("peak_mem_mb", "peak MB"),
    ("weight_mb", "weights MB"),
    ("max_abs_diff", "max abs diff vs eager"),
    ("note", "note"),
]


# -- the shipped configs ---------------------------------------------------------------------------


def _check_choice(kind: str, value: Any, valid: Sequence[str]) -> None:
    if value not in valid:
        raise ValueError(f"unknown {kind} {value!r}; valid: {', '.join(map(repr, valid))}")


def model_spec(model: str) -> dict[str, Any]:
    """The shipped description of `model`: its transformer and scheduler configs (with their
    sources), the pipeline, the job users run (resolution, steps, guidance) and published anchors.

    Args:
        model: one of `MODELS`.

    Raises:
        ValueError: for an unknown model, naming the valid ones.

    >>> model_spec("flux")["transformer"]["num_single_layers"]
    38
    """
    _check_choice("model", model, MODELS)
    text = resources.files(__package__).joinpath("configs", f"{model}.json").read_text()
    spec = json.loads(text)
    if set(spec) != _SPEC_KEYS:
        raise ValueError(
            f"configs/{model}.json: keys {sorted(set(spec) ^ _SPEC_KEYS)} differ from {sorted(_SPEC_KEYS)}"
        )
    for key in ("transformer_class", "pipeline_class", "scheduler_class"):
        if spec[key] not in _CLASSES:
            raise ValueError(f"configs/{model}.json: {key}={spec[key]!r} is not one of {sorted(_CLASSES)}")
    return spec


def _diffusers_class(name: str):
    import diffusers

    if name not in _CLASSES:
        raise ValueError(f"{name!r} is not one of {sorted(_CLASSES)}")
    return getattr(diffusers, name)


def transformer_config(spec: dict[str, Any], depth: int | None = None) -> dict[str, Any]:
    """The transformer config with each repeated-block count (`spec["depth_keys"]`) cut to `depth`.

    >>> transformer_config(model_spec("flux"), depth=1)["num_single_layers"]
    1
    """
    config = dict(spec["transformer"])
    if depth is not None:
        for key in spec["depth_keys"]:
            config[key] = min(depth, config[key])
    return config


# -- random weights on the device ------------------------------------------------------------------

# Random fills that take a generator: under `_SeededInit` they draw from the local one.
_TAKES_GENERATOR = {
    torch.Tensor.uniform_,
    torch.Tensor.normal_,
    torch.Tensor.random_,
    torch.Tensor.bernoulli_,
    torch.Tensor.exponential_,
    torch.Tensor.geometric_,
    torch.Tensor.log_normal_,
    torch.Tensor.cauchy_,
    torch.randn,
    torch.rand,
    torch.randint,
    torch.randperm,
    torch.normal,
    torch.bernoulli,
    torch.multinomial,
    torch.nn.init.uniform_,
    torch.nn.init.normal_,
    torch.nn.init.trunc_normal_,
    torch.nn.init.kaiming_uniform_,
    torch.nn.init.kaiming_normal_,
    torch.nn.init.xavier_uniform_,
    torch.nn.init.xavier_normal_,
    torch.nn.init.orthogonal_,
    torch.nn.init.sparse_,
}
# Random fills that cannot take one: they would draw from the global RNG.
_GLOBAL_RNG_ONLY = {torch.randn_like, torch.rand_like, torch.randint_like}


class _SeededInit(TorchFunctionMode):
    """While a model is built: every random fill draws from `generator` (never torch's global RNG),
    and `torch.empty` without a dtype (how nn.Linear, LayerNorm, Conv and Embedding allocate their
    parameters) allocates in `dtype`, so a 12B model never exists in fp32 on the device.

    A torch-function mode is thread-local: other threads are not affected.
    """

    def __init__(self, generator: torch.Generator, dtype: torch.dtype):
        super().__init__()
        self.generator, self.dtype = generator, dtype

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in _TAKES_GENERATOR and kwargs.get("generator") is None:
            kwargs["generator"] = self.generator
        elif func in _GLOBAL_RNG_ONLY:
            raise RuntimeError(f"{func.__name__} during model construction would draw from torch's global RNG")
        elif func is torch.empty and kwargs.get("dtype") is None:
            kwargs["dtype"] = self.dtype
        return func(*args, **kwargs)


def _keep_fp32(model, name: str) -> bool:
    # As diffusers' from_pretrained(torch_dtype=...) matches `_keep_in_fp32_modules`: a path component.
    from .._diffusers_compat import keep_in_fp32_modules

    keep = keep_in_fp32_modules(model)
    return any(part in keep for part in name.split("."))


def build_transformer(
    spec: dict[str, Any], device: str, dtype: torch.dtype, depth: int | None = None, seed: int = 0
) -> torch.nn.Module:
    """The model's transformer with random weights, built directly on `device` in `dtype`.

    The model's own initialisation runs on the device (its tensors allocated there, the large
    ones in `dtype`), drawing from a local ``torch.Generator(device).manual_seed(seed)``; then the
    parameters are in `dtype` except the model's ``_keep_in_fp32_modules``, as
    ``from_pretrained(torch_dtype=dtype)`` leaves them. Nothing is materialised on the host first.

    Args:
        spec: `model_spec(...)`.
        device: ``"cpu"``, ``"cuda"`` or ``"npu"``.
        dtype: the parameters' dtype.
        depth: blocks of each repeated kind (None: the real count).
        seed: seeds the weights.

    >>> model = build_transformer(model_spec("wan"), "cpu", torch.bfloat16, depth=1)  # doctest: +SKIP
    """
    cls = _diffusers_class(spec["transformer_class"])
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.device(device), _SeededInit(generator, dtype):
        model = cls.from_config(transformer_config(spec, depth))
    with torch.no_grad():
        for name, param in model.named_parameters():
            want = torch.float32 if _keep_fp32(model, name) else dtype
            if param.dtype != want:
                param.data = param.data.to(want)
    return model.eval().requires_grad_(False)


# -- the pipeline and its inputs -------------------------------------------------------------------


def build_pipeline(spec: dict[str, Any], transformer: torch.nn.Module):
    """The stock pipeline around `transformer`, with the model's scheduler and no text encoders or VAE.

    >>> spec = model_spec("wan")
    >>> pipe = build_pipeline(spec, build_transformer(spec, "cpu", torch.bfloat16, depth=1))  # doctest: +SKIP
    >>> latents = pipe(**pipeline_inputs(spec, dict(spec["job"], steps=2, frames=1, height=16, width=16),
    ...                                  "cpu", torch.bfloat16)(), return_dict=False)[0]  # doctest: +SKIP
    """
    import inspect

    pipe_cls = _diffusers_class(spec["pipeline_class"])
    scheduler = _diffusers_class(spec["scheduler_class"]).from_config(spec["scheduler"])
    params = inspect.signature(pipe_cls.__init__).parameters
    absent = {n: None for n, p in params.items() if n != "self" and p.default is inspect.Parameter.empty}
    pipe = pipe_cls(**{**absent, "scheduler": scheduler, "transformer": transformer})
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _embeddings(shape, dtype, device, generator):
    return torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)


def _flux_inputs(cfg, job, device, dtype, gen):
    return dict(
        prompt_embeds=_embeddings((1, job["text_len"], cfg["joint_attention_dim"]), dtype, device, gen),
        pooled_prompt_embeds=_embeddings((1, cfg["pooled_projection_dim"]), dtype, device, gen),
        guidance_scale=job["guidance_scale"],
    )


def _wan_inputs(cfg, job, device, dtype, gen):
    inputs = dict(
        prompt_embeds=_embeddings((1, job["text_len"], cfg["text_dim"]), dtype, device, gen),
        num_frames=job["frames"],
        guidance_scale=job["guidance_scale"] if job["cfg"] else 1.0,
    )
    if job["cfg"]:
        inputs["negative_prompt_embeds"] = _embeddings(
            (1, job["negative_text_len"], cfg["text_dim"]), dtype, device, gen
        )
    return inputs


def _qwen_inputs(cfg, job, device, dtype, gen):
    dim = cfg["joint_attention_dim"]
    inputs = dict(
        prompt_embeds=_embeddings((1, job["text_len"], dim), dtype, device, gen),
        prompt_embeds_mask=torch.ones(1, job["text_len"], dtype=torch.long, device=device),
        true_cfg_scale=job["guidance_scale"] if job["cfg"] else 1.0,
    )
    if job["cfg"]:
        n = job["negative_text_len"]
        inputs.update(
            negative_prompt_embeds=_embeddings((1, n, dim), dtype, device, gen),
            negative_prompt_embeds_mask=torch.ones(1, n, dtype=torch.long, device=device),
        )
    return inputs


# pipeline class -> inputs(transformer config, job, device, dtype, generator) beyond size and steps
_INPUTS: dict[str, Callable] = {
    "FluxPipeline": _flux_inputs,
    "WanPipeline": _wan_inputs,
    "QwenImagePipeline": _qwen_inputs,
}


def pipeline_inputs(
    spec: dict[str, Any], job: dict[str, Any], device: str, dtype: torch.dtype, seed: int = 0
) -> Callable[[], dict[str, Any]]:
    """A function returning the pipeline's call arguments: the same embeddings and, from a fresh
    seeded CPU generator each time, the same initial latents on every call.

    >>> spec = model_spec("flux")
    >>> inputs = pipeline_inputs(spec, dict(spec["job"], text_len=8), "cpu", torch.bfloat16)()
    >>> tuple(inputs["prompt_embeds"].shape), inputs["output_type"]
    ((1, 8, 4096), 'latent')
    """
    gen = torch.Generator().manual_seed(seed)
    fixed = _INPUTS[spec["pipeline_class"]](spec["transformer"], job, device, dtype, gen)
    fixed.update(height=job["height"], width=job["width"], num_inference_steps=job["steps"], output_type="latent")
    return lambda: dict(fixed, generator=torch.Generator().manual_seed(seed + 1))


# -- variants --------------------------------------------------------------------------------------


def _set_eager_attention(model, device: str) -> Callable[[], None]:
    # Users of diffusers on NPU pick its `_native_npu` attention (npu_fusion_attention); SDPA elsewhere.
    if device != "npu":
        return lambda: None
    model.set_attention_backend("_native_npu")
    return model.reset_attention_backend


def _eager(model, device):
    return _set_eager_attention(model, device)


def _ascend(**overrides):
    def setup(model, device, fusions="auto"):
        from diffusers_ascend import disable_ascend_compile, enable_ascend_compile

        enable_ascend_compile(model, fusions=fusions, **overrides)
        return lambda: disable_ascend_compile(model)

    return setup


def _regional(model, device, **compile_kwargs):
    from .._diffusers_compat import repeated_blocks

    model.compile_repeated_blocks(fullgraph=True, **compile_kwargs)
    blocks = [m for m in model.modules() if type(m).__name__ in repeated_blocks(model)]

    def undo():
        for block in blocks:
            block._compiled_call_impl = None  # what nn.Module.compile set

    return undo


def _by_name(model, device, fusions="auto"):
    # What a stack that picks backends by name runs: diffusers' own call, our backend's name.
    return _regional(model, device, backend="ascend", options={"fusions": fusions})


def _mindiesd(model, device):
    from mindiesd.compilation import MindieSDBackend

    restore_attention = _set_eager_attention(model, device)
    # cache-dit on NPU: the whole transformer, one backend instance, dynamic=True.
    model.compile(backend=MindieSDBackend(), dynamic=True)

    def undo():
        model._compiled_call_impl = None
        restore_attention()

    return undo


def _graph_unavailable(device: str) -> str | None:
    from diffusers_ascend.platform import graph_capture_supported

    if not graph_capture_supported(device):
        return f"graph capture needs device graphs (CUDA or Ascend NPU); there are none on {device}"
    return None


def _regional_unavailable(device: str) -> str | None:
    if device == "npu" and importlib.util.find_spec("triton") is None:
        return "compile_repeated_blocks compiles with Inductor, which on NPU needs triton-ascend (not installed)"
    return None


def _mindiesd_unavailable(device: str) -> str | None:
    if device != "npu":
        return f"MindIE SD runs on Ascend NPUs only; the device is {device}"
    if importlib.util.find_spec("mindiesd") is None:
        return "mindiesd is not installed (pip install mindiesd)"
    from ascend_kernels.npu import mindiesd_torch_unsupported

    return mindiesd_torch_unsupported()  # e.g. MindIE SD 3.1.0 on torch 2.14: its import would raise


# name -> (what it is, why it cannot run on a device or None, setup(model, device) -> undo)
VARIANT_SPECS: dict[str, tuple[str, Callable[[str], str | None], Callable]] = {
    "eager": ("diffusers eager (attention '_native_npu' on NPU, SDPA elsewhere)", lambda d: None, _eager),
    "ascend": ('enable_ascend_compile(fusions="auto")', lambda d: None, _ascend()),
    "ascend+graph": (
        'enable_ascend_compile(fusions="auto", graph_capture="graph_with_compile")',
        _graph_unavailable,
        _ascend(graph_capture="graph_with_compile"),
    ),
    "regional": ("diffusers compile_repeated_blocks(fullgraph=True), Inductor", _regional_unavailable, _regional),
    "ascend-by-name": (
        'diffusers compile_repeated_blocks(fullgraph=True, backend="ascend", options={"fusions": "auto"})',
        lambda d: None,
        _by_name,
    ),
    "mindiesd": (
        "torch.compile(transformer, backend=MindieSDBackend(), dynamic=True), as cache-dit on NPU",
        _mindiesd_unavailable,
        _mindiesd,
    ),
}


def _quantize(model, quant: str) -> None:
    """torchao's ``quantize_`` with the scheme `quant` names (`QUANTS`), on the model's linears."""
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, quantize_

    config = {"int8-dynamic": Int8DynamicActivationInt8WeightConfig, "int8-weight": Int8WeightOnlyConfig}[quant]
    quantize_(model, config(set_inductor_config=False))  # no process-wide Inductor settings


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes the parameters hold: a torchao tensor counts its inner tensors (int8 data, scales)."""
    total = 0
    for p in model.parameters():
        names = list(getattr(p, "tensor_data_names", ())) + list(getattr(p, "optional_tensor_data_names", ()))
        inner = [getattr(p, n, None) for n in names]
        inner = [t for t in inner if isinstance(t, torch.Tensor)]
        total += sum(t.numel() * t.element_size() for t in inner) if inner else p.numel() * p.element_size()
    return total


def _ascend_all(model, device):
    from diffusers_ascend import disable_ascend_compile, enable_ascend_compile

    # "all": the int8 fusions on every device (under "auto" a CPU host fuses nothing).
    enable_ascend_compile(model, fusions="all")
    return lambda: disable_ascend_compile(model)


# Under --quant, what each variant runs on the quantized transformer.
QUANT_VARIANT_SPECS: dict[str, tuple[str, Callable]] = {
    "eager": ("torchao's own eager path", _eager),
    "ascend": ('enable_ascend_compile(fusions="all"): the int8 linears into ascend_kernels ops', _ascend_all),
    "regional": ("torchao + diffusers compile_repeated_blocks(fullgraph=True), Inductor", _regional),
}
# The variants whose fusions `run_e2e(fusions=...)` sets (their descriptions name "auto").
FUSING_VARIANTS = ("ascend", "ascend+graph", "ascend-by-name")


# -- measuring -------------------------------------------------------------------------------------


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


class _PeakMemory:
    """Peak memory over a `with` block, in MB: the device allocator's peak on CUDA/NPU; on CPU the
    peak resident set size (sampled every 10 ms) minus `baseline` (the RSS before the model was built)."""

    def __init__(self, device: str, baseline: int | None):
        self.device, self.baseline, self.mb = device, baseline, None
        self._stop, self._peak = threading.Event(), 0

    def _sample(self):
        while not self._stop.wait(0.01):
            self._peak = max(self._peak, _rss_bytes() or 0)

    def __enter__(self):
        if self.device == "cpu":
            self._peak = _rss_bytes() or 0
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        else:
            getattr(torch, self.device).reset_peak_memory_stats()
        return self

    def __exit__(self, *exc):
        if self.device == "cpu":
            self._stop.set()
            self._thread.join()
            self._peak = max(self._peak, _rss_bytes() or 0)
            if self.baseline is not None and self._peak:
                self.mb = (self._peak - self.baseline) / 2**20
        else:
            self.mb = getattr(torch, self.device).max_memory_allocated() / 2**20
        return False


PEAK_MEMORY_KIND = {
    "cpu": "peak resident set size of the process during the variant (sampled every 10 ms) minus the RSS before "
    "the model was built: weights + activations + compiler",
    "cuda": "torch.cuda.max_memory_allocated() over the variant (weights included)",
    "npu": "torch.npu.max_memory_allocated() over the variant (weights included)",
}


def _run_variant(
    name, model, pipe, inputs, device, reference, baseline, tick, quant=None, fusions="auto"
) -> dict[str, Any]:
    description, _, setup = VARIANT_SPECS[name]
    if quant is not None:  # the quantized transformer: the row is named by its scheme
        description, setup = QUANT_VARIANT_SPECS[name]
    elif name in FUSING_VARIANTS:
        description = description.replace('"auto"', json.dumps(fusions))
        setup = functools.partial(setup, fusions=fusions)
    sync = synchronize(device)
    marks: list[float] = []

    def on_step(pipe_, i, t, kwargs):
        sync()
        marks.append(time.perf_counter())
        tick()
        return {}

    def call():
        return pipe(**inputs(), callback_on_step_end=on_step, return_dict=False)[0]

    row: dict[str, Any] = dict(
        name=name if quant is None else f"{quant} {name}",
        description=description,
        weight_mb=weight_bytes(model) / 2**20,
    )
    undo = None
    try:
        # A fresh dynamo state and an empty Inductor cache: each variant's cold start is a first
        # run's, whatever ran before it in this process or on this machine.
        with cold_compile(), _PeakMemory(device, baseline) as mem:
            start = time.perf_counter()
            undo = setup(model, device)
            row["setup_s"] = time.perf_counter() - start
            call()  # the cold call: compiles at its first step
            row["cold_s"] = marks[0] - start
            row["cold_call_s"] = marks[-1] - start
            marks.clear()
            sync()
            start = time.perf_counter()
            out = call()
            sync()
            row["e2e_s"] = time.perf_counter() - start
        steps = [b - a for a, b in zip([start, *marks[:-1]], marks)]
        row.update(
            status="ok", step_ms=statistics.median(steps) * 1e3, steps_ms=[s * 1e3 for s in steps], peak_mem_mb=mem.mb
        )
        if name in FUSING_VARIANTS:
            from diffusers_ascend import ascend_report, compiled_report

            report = compiled_report(model) if name == "ascend-by-name" else ascend_report(model)
            row.update(
                fusions=dict(report.matches), graphs_compiled=report.graphs_compiled, fallbacks=len(report.fallbacks)
            )
            fused = ", ".join(f"{k} {v}" for k, v in report.matches.items() if v) or "none"
            row["note"] = f"fusions: {fused}; {report.graphs_compiled} graphs" + (
                f"; {len(report.fallbacks)} blocks fell back to eager" if report.fallbacks else ""
            )
        out = out.float()
        # None where there is nothing to compare with: the eager reference failed.
        row["max_abs_diff"] = (
            0.0
            if name == "eager" and quant is None
            else None
            if reference is None
            else ((out - reference).abs().max().item())
        )
        row["output"] = out
    except Exception as e:  # one variant failing (a backend on a new stack) must not lose the others
        row.update(status="failed", note=error_line(e))
    finally:
        if undo is not None:
            undo()
    return row


# -- the run ---------------------------------------------------------------------------------------


def _job(spec, height, width, frames, steps, text_len) -> dict[str, Any]:
    job = dict(spec["job"])
    video = job["frames"] is not None
    if frames is not None and not video:
        raise ValueError(f"--frames applies to video models; {spec['name']!r} makes images")
    for key, value in (
        ("height", height),
        ("width", width),
        ("steps", steps),
        ("frames", frames),
        ("text_len", text_len),
    ):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key} must be a positive integer, got {value!r}")
        job[key] = value
    for key in ("height", "width"):
        if job[key] % 16:  # VAE scale 8 x patch 2, for all four models
            raise ValueError(f"{key}={job[key]} must be a multiple of 16")
    if video and (job["frames"] - 1) % 4:
        raise ValueError(f"frames={job['frames']} must be 4k+1 (1, 5, ..., 81): the Wan VAE compresses time 4x")
    if job["negative_text_len"] is not None and text_len is not None:
        job["negative_text_len"] = min(job["negative_text_len"], text_len)
    return job


def _anchors(spec, job, depth_used, dtype: str = "bf16") -> list[dict[str, Any]]:
    # Comparable: the whole model in bf16 running the model's usual job (the one the published
    # numbers are for: resolution, steps, frames, guidance, prompt lengths), as each anchor states it.
    same_run = (
        dtype == "bf16"
        and job == spec["job"]
        and all(depth_used[k] == spec["transformer"][k] for k in spec["depth_keys"])
    )
    return [
        dict(anchor, comparable=same_run and all(job.get(k) == v for k, v in anchor["job"].items()))
        for anchor in spec["anchors"]
    ]


def _check_device(device: str) -> None:
    _check_choice("device", device, DEVICES)
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' asked for, but torch.cuda.is_available() is False")
    if device == "npu":
        if importlib.util.find_spec("torch_npu") is None:
            raise ValueError("device 'npu' needs torch_npu (and CANN) installed")
        import torch_npu  # noqa: F401  (registers torch.npu)

        if not torch.npu.is_available():  # type: ignore[attr-defined]
            raise ValueError("device 'npu' asked for, but torch.npu.is_available() is False")


def run_e2e(
    model: str = "flux",
    depth: int | None = None,
    steps: int | None = None,
    height: int | None = None,
    width: int | None = None,
    frames: int | None = None,
    text_len: int | None = None,
    device: str | None = None,
    dtype: str = "bf16",
    variants: Sequence[str] | None = None,
    seed: int = 0,
    out_dir: str | os.PathLike | None = None,
    progress: bool = True,
    quant: str | None = None,
    fusions: str = "auto",
) -> dict[str, Any]:
    """Runs the model's denoising loop once per variant and measures it (see the module docstring).

    Args:
        model: one of `MODELS` (``"flux"``, ``"wan"``, ``"wan-14b"``, ``"qwen-image"``).
        depth: blocks of each repeated kind (Flux: ``depth`` double and ``depth`` single blocks),
            at most the real count; None runs the whole model.
        steps, height, width, frames, text_len: override the job users run (`model_spec(model)["job"]`);
            height and width multiples of 16, frames 4k+1 (video models only).
        device: ``"cpu"``, ``"cuda"`` or ``"npu"``; default: this machine's platform.
        dtype: ``"bf16"`` (the models' dtype) or ``"fp32"``.
        variants: names from `VARIANTS` (default: all); ``"eager"`` always runs first, as the reference.
        seed: seeds the weights, the embeddings and the latents.
        out_dir: where to write ``e2e-<model>-<device>[-depthN].json/.md/.png`` (None: nothing written).
        progress: show a progress bar (stderr) over the denoising steps.
        quant: ``"int8-dynamic"`` or ``"int8-weight"`` (`QUANTS`): after the float ``eager`` reference,
            the transformer's linears are quantized with torchao and the variants run again on it (of
            ``eager``, ``ascend`` (``fusions="all"``) and ``regional``; rows ``"<quant> <variant>"``,
            their ``max_abs_diff`` against the float reference). Every row has ``weight_mb``.
        fusions: the fusions of the variants that fuse (`FUSING_VARIANTS`), as ``AscendConfig(fusions=...)``
            takes them (``"auto"`` fuses nothing on a CPU; ``"all"`` or ``"rms_norm,rope"`` fuse there too).

    Returns:
        ``{"benchmark": "e2e", "model", "title", "config", "depth", "job", "variants", "machine",
        "anchors", ...}``; each variant has ``name``, ``status`` (ok, failed or skipped), ``cold_s``
        (enable + first step, compilation included), ``step_ms`` (median step of a second, warm
        call), ``e2e_s`` (that warm call), ``peak_mem_mb`` (see ``peak_mem_kind``) and
        ``max_abs_diff`` (final latents against eager's; None when the eager run failed), or ``note``
        (why it was skipped or failed: a failed variant, eager included, is a row, not an exception).

    Raises:
        ValueError: an unknown model, variant, device or dtype (naming the valid ones), a bad size,
            a device this machine lacks, or an `out_dir` that cannot be written; raised before
            anything is built.

    >>> result = run_e2e("flux", depth=1, height=128, width=128, steps=2, text_len=64, device="cpu",
    ...                  out_dir="bench-results")  # doctest: +SKIP
    >>> [(v["name"], v["status"]) for v in result["variants"]][-1]  # doctest: +SKIP
    ('mindiesd', 'skipped')
    """
    from tqdm.auto import tqdm

    from diffusers_ascend.platform import current_platform

    spec = model_spec(model)
    device = device or current_platform()
    _check_choice("dtype", dtype, tuple(DTYPES))
    names = list(dict.fromkeys(variants or VARIANTS))
    for name in names:
        _check_choice("variant", name, VARIANTS)
    names = ["eager"] + [n for n in names if n != "eager"]
    if quant is not None:
        _check_choice("quant", quant, QUANTS)
        if importlib.util.find_spec("torchao") is None:
            raise ValueError("--quant needs torchao (pip install diffusers-ascend[quant])")
        names = [n for n in names if n in QUANT_VARIANT_SPECS] if variants else list(QUANT_VARIANT_SPECS)
    from diffusers_ascend.config import check_field

    check_field("fusions", fusions)  # a bad name raises here, naming the valid ones
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 1):
        raise ValueError(f"depth must be a positive integer, got {depth!r}")
    job = _job(spec, height, width, frames, steps, text_len)
    _check_device(device)
    if out_dir is not None:
        check_out_dir(out_dir)
    register_ops()

    config = transformer_config(spec, depth)
    calls_per_step = 2 if job["cfg"] else 1
    skipped = {n: VARIANT_SPECS[n][1](device) for n in names}
    runnable = [n for n in names if skipped[n] is None]
    bar = tqdm(
        total=(len(runnable) + (quant is not None)) * 2 * job["steps"],
        desc=f"e2e {model}",
        unit="step",
        file=sys.stderr,
        disable=not progress,
    )
    started = time.perf_counter()
    if any(n != "eager" for n in runnable):
        # Once-per-process costs (importing Inductor, registering our patterns) outside every
        # measurement: the first compiled variant is not penalised for running first.
        warm_up_compiler(inductor=device != "npu" or "regional" in runnable)
    baseline = _rss_bytes()
    built = time.perf_counter()
    transformer = build_transformer(spec, device, DTYPES[dtype], depth, seed)
    build_s = time.perf_counter() - built
    pipe = build_pipeline(spec, transformer)
    inputs = pipeline_inputs(spec, job, device, DTYPES[dtype], seed)

    rows, reference = [], None
    try:
        for name in names:
            if skipped[name] is not None:
                rows.append(dict(name=name, description=VARIANT_SPECS[name][0], status="skipped", note=skipped[name]))
                continue
            bar.set_postfix_str(name)
            row = _run_variant(
                name, transformer, pipe, inputs, device, reference, baseline, lambda: bar.update(1), fusions=fusions
            )
            output = row.pop("output", None)
            if name == "eager":
                reference = output
            elif rows[0]["status"] != "ok" and row["status"] == "ok":
                # A failed eager run (out of memory at this size, say) is a row like any other: the
                # variants still run and are timed, with nothing to compare their output with.
                row["note"] = "; ".join(filter(None, [row.get("note"), "not compared: the eager reference failed"]))
            rows.append(row)
        if quant is not None:
            _quantize(transformer, quant)
            for name in runnable:
                bar.set_postfix_str(f"{quant} {name}")
                row = _run_variant(
                    name, transformer, pipe, inputs, device, reference, baseline, lambda: bar.update(1), quant
                )
                row.pop("output", None)
                rows.append(row)
    finally:  # Ctrl-C included: the bar's line ends before the CLI's message
        bar.close()
    del pipe, transformer

    depth_used = {k: config[k] for k in spec["depth_keys"]}
    result = dict(
        benchmark="e2e",
        model=model,
        title=spec["title"],
        repo=spec["repo"],
        transformer_class=spec["transformer_class"],
        config=config,
        config_source=spec["transformer_source"],
        depth=depth_used,
        full_depth={k: spec["transformer"][k] for k in spec["depth_keys"]},
        parameters=None,
        dtype=dtype,
        device=device,
        job=job,
        job_notes=spec["job_notes"],
        transformer_calls_per_step=calls_per_step,
        pipeline=spec["pipeline_class"],
        scheduler=dict(spec["scheduler"], _class_name=spec["scheduler_class"]),
        scheduler_source=spec["scheduler_source"],
        leaves_out=list(LEAVES_OUT),
        seed=seed,
        fusions=fusions,
        peak_mem_kind=PEAK_MEMORY_KIND[device],
        build_s=build_s,
        variants=rows,
        columns=COLUMNS,
        machine=machine_info(device),
        anchors=_anchors(spec, job, depth_used, dtype),
        seconds=time.perf_counter() - started,
        quant=quant,
    )
    result["parameters"] = _parameter_count(spec, config)
    result["command"] = e2e_command(result, names)
    if out_dir is not None:
        write_e2e(result, out_dir)
    return result


def _parameter_count(spec, config) -> int:
    cls = _diffusers_class(spec["transformer_class"])
    with torch.device("meta"):
        return sum(p.numel() for p in cls.from_config(config).parameters())


# -- files -----------------------------------------------------------------------------------------


def result_stem(result: dict[str, Any]) -> str:
    """``e2e-<model>-<device>``, plus ``-depthN`` when fewer blocks than the real model ran, plus
    ``-<quant>`` under ``--quant``."""
    stem = f"e2e-{result['model']}-{result['device']}"
    if result["depth"] != result["full_depth"]:
        stem += f"-depth{min(result['depth'].values())}"
    if result.get("quant"):
        stem += f"-{result['quant']}"
    return stem


def e2e_command(result: dict[str, Any], variants: Sequence[str] | None = None) -> str:
    """The ``diffusers-ascend bench e2e`` command line that repeats `result`'s run."""
    parts = ["diffusers-ascend", "bench", "e2e", "--model", result["model"]]
    if result["depth"] != result["full_depth"]:
        parts += ["--depth", str(min(result["depth"].values()))]
    default = model_spec(result["model"])["job"]
    for key, flag in (
        ("height", "--height"),
        ("width", "--width"),
        ("frames", "--frames"),
        ("steps", "--steps"),
        ("text_len", "--text-len"),
    ):
        if result["job"][key] != default[key]:
            parts += [flag, str(result["job"][key])]
    parts += ["--device", result["device"]]
    if result["dtype"] != "bf16":
        parts += ["--dtype", result["dtype"]]
    if variants is not None and list(variants) != ["eager", *[v for v in VARIANTS if v != "eager"]]:
        parts += ["--variants", *variants]
    if result["seed"]:
        parts += ["--seed", str(result["seed"])]
    if result.get("quant"):
        parts += ["--quant", result["quant"]]
    fusions = result.get("fusions", "auto")
    if fusions != "auto":
        parts += ["--fusions", fusions if isinstance(fusions, str) else ",".join(fusions)]
    return " ".join(parts)


def _job_line(result) -> str:
    job = result["job"]
    size = f"{job['width']}x{job['height']}" + (f", {job['frames']} frames" if job["frames"] else "")
    depth = ", ".join(f"{k}={v} of {result['full_depth'][k]}" for k, v in result["depth"].items())
    return (
        f"{size}, {job['steps']} steps, {result['transformer_calls_per_step']} transformer call(s) per step, "
        f"text {job['text_len']} tokens; {depth}; {result['parameters'] / 1e9:.2f}B parameters in {result['dtype']} "
        f"on {result['device']}"
    )


def e2e_markdown(result: dict[str, Any]) -> str:
    """The result as markdown: job, machine, the variants' table and the anchors beside them."""
    machine = result["machine"]
    lines = [
        f"# {result['title']} end to end ({result['transformer_class']}, random weights)",
        "",
        f"Job: {_job_line(result)}.",
        "",
        f"Command: `{result['command']}`",
        "",
        f"Config: `{json.dumps(result['config'])}` ({result['config_source']}).",
        "",
        f"Timed: the stock `{result['pipeline']}.__call__` denoising loop with `{result['scheduler']['_class_name']}`; "
        f"left out: {'; '.join(result['leaves_out'])}. cold = enable + first step (compilation included); step = "
        f"median step of a second, warm call; e2e = that warm call. Peak memory: {result['peak_mem_kind']}.",
        "",
        f"Machine: {machine['device']}, {machine['cpu']} ({machine['cpu_usable']} usable cores), torch "
        f"{machine['torch']}, diffusers {machine['diffusers']}, load {machine['load_avg_1m']}, {machine['date']}; "
        f"model built in {result['build_s']:.1f} s, whole run {result['seconds']:.1f} s.",
        "",
        markdown_table(result["variants"], COLUMNS),
        "",
    ]
    if result["anchors"]:
        lines += [
            "Published numbers for this model (end to end, whole model; `comparable`: same job and full depth "
            "as this run):",
            "",
        ]
        anchors = [dict(a, seconds=str(a["seconds"])) for a in result["anchors"]]  # as published, unrounded
        lines += [
            markdown_table(
                anchors,
                [
                    ("what", "what"),
                    ("hardware", "hardware"),
                    ("seconds", "s"),
                    ("job.steps", "steps"),
                    ("job.height", "height"),
                    ("job.width", "width"),
                    ("comparable", "comparable"),
                    ("source", "source"),
                ],
            ),
            "",
        ]
    return "\n".join(lines)


def e2e_text(result: dict[str, Any]) -> str:
    """A fixed-width summary for the terminal."""
    return f"{result['title']}: {_job_line(result)}\n{text_table(result['variants'], COLUMNS)}\n"


def write_e2e(result: dict[str, Any], out_dir: str | os.PathLike) -> dict[str, str]:
    """Writes ``<stem>.json``, ``<stem>.md`` and ``<stem>.png`` (see `result_stem`); returns their paths.

    Raises:
        ImportError: when matplotlib is missing (``pip install 'diffusers-ascend[bench]'``).

    >>> paths = write_e2e(run_e2e("wan", depth=1, steps=2, progress=False), "bench-results")  # doctest: +SKIP
    >>> sorted(paths)  # doctest: +SKIP
    ['json', 'md', 'png']
    """
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.join(str(out_dir), result_stem(result))
    paths = {ext: f"{stem}.{ext}" for ext in ("json", "md", "png")}
    plot_e2e(result, paths["png"])
    with open(paths["json"], "w") as f:
        json.dump(json.loads(json.dumps(result, default=str)), f, indent=2)
        f.write("\n")
    with open(paths["md"], "w") as f:
        f.write(e2e_markdown(result))
    return paths


def plot_e2e(result: dict[str, Any], path: str | os.PathLike) -> None:
    """Three panels: cold start, median step and end to end per variant, the anchors as lines on the
    last (labelled as not comparable unless the run is the anchors' job at full depth)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("plotting the e2e benchmark needs matplotlib: pip install 'diffusers-ascend[bench]'") from e

    ran = [v for v in result["variants"] if v["status"] == "ok"]
    labels = [v["name"] for v in ran]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4))
    for ax, key, ylabel in zip(
        axes, ("cold_s", "step_ms", "e2e_s"), ("cold start (s)", "median step (ms)", "end to end (s)")
    ):
        bars = ax.bar(range(len(ran)), [v[key] for v in ran], color="tab:blue")
        ax.bar_label(bars, fmt="%.3g", fontsize=8)
        ax.set_xticks(range(len(ran)), labels, rotation=15, fontsize=8)
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", alpha=0.3)
    # Published numbers are drawn only beside a run of the same job at full depth: next to a
    # shortened run they would read as a comparison they are not.
    comparable = [a for a in result["anchors"] if a["comparable"]]
    for i, anchor in enumerate(comparable):
        axes[2].axhline(
            anchor["seconds"],
            linestyle=":",
            linewidth=0.9,
            color=f"C{(i % 9) + 1}",
            label=f"{anchor['what']}, {anchor['hardware']}: {anchor['seconds']} s",
        )
    if comparable:
        axes[2].legend(fontsize=6, title="published, same job", title_fontsize=6)
    elif result["anchors"]:
        axes[2].set_title(
            f"{len(result['anchors'])} published numbers are for another job or the full depth (in the .md/.json)",
            fontsize=7,
        )
    skipped = [f"{v['name']} ({v['status']})" for v in result["variants"] if v["status"] != "ok"]
    machine = result["machine"]
    where = machine["cpu"] if result["device"] == "cpu" else machine["device"]
    fig.suptitle(
        f"{result['title']}: {_job_line(result)}\n{where}, torch {machine['torch']}"
        + (f"; not run: {', '.join(skipped)}" if skipped else ""),
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cli(args) -> int:
    """``diffusers-ascend bench e2e``: 0 when every variant ran, 1 when one failed (or the model could not be built)."""
    try:
        result = run_e2e(
            model=args.model,
            depth=args.depth,
            steps=args.steps,
            height=args.height,
            width=args.width,
            frames=args.frames,
            text_len=args.text_len,
            device=args.device,
            dtype=args.dtype,
            variants=args.variants,
            seed=args.seed,
            out_dir=args.out,
            progress=not args.json,
            quant=getattr(args, "quant", None),
            fusions=args.fusions,
        )
    except (RuntimeError, MemoryError) as e:  # building the model at this size (out of memory, say)
        print(f"diffusers-ascend bench e2e: error: {error_line(e)}", file=sys.stderr)
        return 1
    failed = [v for v in result["variants"] if v["status"] == "failed"]
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if k != "columns"}, indent=2, default=str))
    else:
        print(e2e_text(result) + f"wrote {os.path.join(args.out, result_stem(result))}.json, .md and .png")
    for v in failed:
        print(
            f"diffusers-ascend bench e2e: variant {v['name']} failed: {v['note']}"
            + (" (the other variants ran, not compared)" if v["name"] == "eager" else ""),
            file=sys.stderr,
        )
    return 1 if failed else 0


__all__ = [
    "MODELS",
    "QUANTS",
    "weight_bytes",
    "VARIANTS",
    "DEVICES",
    "model_spec",
    "e2e_command",
    "transformer_config",
    "build_transformer",
    "build_pipeline",
    "pipeline_inputs",
    "run_e2e",
    "write_e2e",
    "plot_e2e",
    "e2e_markdown",
    "e2e_text",
    "result_stem",
]
