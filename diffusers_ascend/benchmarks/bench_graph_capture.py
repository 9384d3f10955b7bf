"""Benchmark `graph_capture`: eager executor and Inductor, each with and without CUDA graph capture.

    diffusers-ascend bench graph_capture --out benchmarks/results/   # writes graph_capture.json

A full-width Flux transformer (dim 3072, 24 heads of 128; 2 double + 4 single blocks by default,
random bf16 weights) at two sizes: a launch-bound one (128x128 image: 64 image + 64 text tokens)
and Flux 1024x1024 (4096 + 512 tokens). Each configuration is `enable_ascend_compile` on the same
model (compile="blocks": one captured graph per block instance), timed with CUDA events over a
changing timestep (median of --iters calls after warm-up), and its output compared with the
uncompiled model's. Prints and writes JSON with the GPU's name, the latencies, the differences and
the ratios:

- ``eager_capture / eager``: capture over the eager executor (target <= 0.8 at the launch-bound size);
- ``inductor_capture / inductor_default``: fusions + capture against Inductor's default
  (``torch.compile`` of each block, diffusers' ``compile_repeated_blocks``); target <= 1.0 at 1024^2.

Refuses without CUDA (CUDA graphs need a GPU; on Ascend the same wrapper captures NPUGraphs,
which this benchmark does not measure).
"""

from __future__ import annotations

import itertools
import statistics

from ._common import machine_info, time_ms, write_json

SIZES = {"launch_bound": (128, 128), "flux_1024": (1024, 1024)}
TXT_TOKENS = {"launch_bound": 64, "flux_1024": 512}
CONFIGS = {
    # name: enable_ascend_compile overrides (None: diffusers' compile_repeated_blocks, Inductor's default)
    "eager": dict(executor="eager"),
    "eager_capture": dict(executor="eager", graph_capture="graph_with_compile"),
    "inductor_default": None,
    "inductor": dict(executor="inductor"),
    "inductor_capture": dict(executor="inductor", graph_capture="graph_with_compile"),
    # Capture adds a copy of each block input into its static buffer (no copy where the caller
    # passes that buffer) and, with safe_output, a clone of each output: per block under
    # compile="blocks", once per forward under compile="model".
    "inductor_capture_unsafe": dict(executor="inductor", graph_capture="graph_with_compile", safe_output=False),
    "inductor_model": dict(executor="inductor", compile="model"),
    "eager_capture_model": dict(executor="eager", graph_capture="graph_with_compile", compile="model"),
    "inductor_capture_model": dict(executor="inductor", graph_capture="graph_with_compile", compile="model"),
}


# Flux.1's transformer widths; the block counts are arguments.
FLUX_FULL = dict(
    patch_size=1,
    in_channels=64,
    attention_head_dim=128,
    num_attention_heads=24,
    joint_attention_dim=4096,
    pooled_projection_dim=768,
    guidance_embeds=True,
    axes_dims_rope=[16, 56, 56],
)


def _model(layers: int, single_layers: int):
    import torch

    from diffusers_ascend.tiny import tiny_flux_transformer

    model = tiny_flux_transformer(num_layers=layers, num_single_layers=single_layers, **FLUX_FULL)
    return model.to("cuda", torch.bfloat16).eval()


def _inputs(size: str, steps: int):
    import torch

    from diffusers_ascend.tiny import flux_model_inputs

    h, w = SIZES[size]
    inputs = flux_model_inputs(
        h // 16, w // 16, TXT_TOKENS[size], config=FLUX_FULL, dtype=torch.bfloat16
    )  # VAE /8, 2x2 patches
    del inputs["timestep"]  # one per step, below
    common = {k: v.to("cuda") if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    common["guidance"] = torch.full((1,), 3.5, device="cuda")
    timesteps = [torch.full((1,), 1.0 - i / steps, device="cuda", dtype=torch.bfloat16) for i in range(steps)]
    return common, timesteps


def _time(model, common, timesteps, warmup: int, iters: int) -> float:
    steps = itertools.cycle(timesteps)  # a changing timestep, as in a denoising loop
    return statistics.median(time_ms(lambda: model(timestep=next(steps), **common), iters, warmup, "cuda"))


def _ratios(ms: dict) -> dict:
    pairs = [
        ("eager_capture", "eager"),
        ("eager_capture_model", "eager"),
        ("inductor_capture", "inductor"),
        ("inductor_capture", "inductor_default"),
        ("inductor_capture_unsafe", "inductor_default"),
        ("inductor_capture_model", "inductor_default"),
        ("inductor_capture_model", "inductor_model"),
        ("eager_capture", "inductor_default"),
    ]
    return {f"{a}/{b}": ms[a] / ms[b] for a, b in pairs if a in ms and b in ms}


def run(
    layers: int = 2,
    single_layers: int = 4,
    iters: int = 20,
    warmup: int = 5,
    sizes=tuple(SIZES),
    configs=tuple(CONFIGS),
) -> dict:
    import torch

    import diffusers_ascend

    if not torch.cuda.is_available():
        raise SystemExit(
            "bench graph_capture needs a CUDA GPU (it measures CUDA graphs); none is available here. "
            "Run it on a GPU host; NPUGraph capture on Ascend is not measured by this benchmark."
        )
    model = _model(layers, single_layers)
    result = {
        "benchmark": "graph_capture",
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "dtype": "bfloat16",
        "machine": machine_info("cuda"),
        "model": f"FluxTransformer2DModel full width (3072), {layers} double + {single_layers} single blocks, random weights",
        "configs": {name: CONFIGS[name] for name in configs},
        "iters": iters,
        "warmup": warmup,
        "sizes": {},
    }
    with torch.no_grad():
        for size in sizes:
            common, timesteps = _inputs(size, steps=max(iters, warmup))
            ms = {"uncompiled": _time(model, common, timesteps, warmup, iters)}
            ref = model(timestep=timesteps[0], **common)[0].float()
            diff = {}
            for name in configs:
                overrides = CONFIGS[name]
                torch.compiler.reset()
                if overrides is None:
                    model.compile_repeated_blocks(fullgraph=True)
                else:
                    diffusers_ascend.enable_ascend_compile(model, attention=None, **overrides)
                ms[name] = _time(model, common, timesteps, warmup, iters)
                # A fast wrong path is no result: record how far each configuration is from eager.
                diff[name] = (model(timestep=timesteps[0], **common)[0].float() - ref).abs().max().item()
                if overrides is None:
                    for block in list(model.transformer_blocks) + list(model.single_transformer_blocks):
                        block._compiled_call_impl = None  # undo compile_repeated_blocks
                else:
                    report = diffusers_ascend.ascend_report(model)
                    if report.fallbacks:
                        ms[name + "_fallbacks"] = [f.to_dict() for f in report.fallbacks]  # JSON
                    diffusers_ascend.disable_ascend_compile(model)
            h, w = SIZES[size]
            result["sizes"][size] = {
                "resolution": f"{h}x{w}",
                "tokens": {"image": (h // 16) * (w // 16), "text": TXT_TOKENS[size]},
                "ms": ms,
                "max_abs_diff_vs_uncompiled": diff,
                "ratios": _ratios(ms),
            }
            torch.compiler.reset()
    return result


def cli(args) -> int:
    """``diffusers-ascend bench graph_capture``: prints the latencies and ratios, writes graph_capture.json."""
    result = run(args.layers, args.single_layers, args.iters, args.warmup, tuple(args.sizes), tuple(args.configs))
    print(f"{result['gpu']}, torch {result['torch']}, {result['model']}")
    for size, r in result["sizes"].items():
        print(f"\n{size} ({r['resolution']})")
        for name, ms in r["ms"].items():
            if isinstance(ms, float):
                print(f"  {name:<26} {ms:8.3f} ms   max |diff| {r['max_abs_diff_vs_uncompiled'].get(name, 0.0):.4g}")
        for name, ratio in r["ratios"].items():
            print(f"  {name:<42} {ratio:.3f}")
    write_json(result, args.out, "graph_capture.json")
    return 0
