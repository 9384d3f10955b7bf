"""Graph capture on a CUDA GPU: eager executor and Inductor, each with and without capture, in one run.

    python benchmarks/graph_capture.py --out benchmarks/results/graph_capture.json

A full-width Flux transformer (dim 3072, 24 heads of 128; 2 double + 4 single blocks by default,
random bf16 weights) at two sizes: a launch-bound one (128x128 image: 64 image + 64 text tokens)
and Flux 1024x1024 (4096 + 512 tokens). Each configuration is `enable_ascend_compile` on the same
model (compile="blocks": one captured graph per block instance), timed with CUDA events over a
changing timestep (median of --iters calls after warm-up), and its output compared with the
uncompiled model's. Prints and writes JSON with the GPU's name, the latencies, the differences and
the ratios the issue asks for:

- ``eager_capture / eager``: capture over the eager executor (target <= 0.8 at the launch-bound size);
- ``inductor_capture / inductor_default``: fusions + capture against Inductor's default
  (``torch.compile`` of each block, diffusers' ``compile_repeated_blocks``); target <= 1.0 at 1024^2.

Refuses without CUDA (CUDA graphs need a GPU; on Ascend the same wrapper captures NPUGraphs,
which this script does not measure).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

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


def _model(layers: int, single_layers: int):
    import torch
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    model = FluxTransformer2DModel(
        patch_size=1, in_channels=64, num_layers=layers, num_single_layers=single_layers, attention_head_dim=128,
        num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
        axes_dims_rope=[16, 56, 56],
    )
    return model.to("cuda", torch.bfloat16).eval()


def _inputs(size: str, steps: int):
    import torch

    h, w = SIZES[size]
    lh, lw = h // 16, w // 16  # VAE /8, then 2x2 patches
    gen = torch.Generator("cuda").manual_seed(0)
    img_ids = torch.zeros(lh, lw, 3, device="cuda")
    img_ids[..., 1] = torch.arange(lh, device="cuda")[:, None]
    img_ids[..., 2] = torch.arange(lw, device="cuda")[None, :]
    common = dict(
        hidden_states=torch.randn(1, lh * lw, 64, generator=gen, device="cuda", dtype=torch.bfloat16),
        encoder_hidden_states=torch.randn(1, TXT_TOKENS[size], 4096, generator=gen, device="cuda", dtype=torch.bfloat16),
        pooled_projections=torch.randn(1, 768, generator=gen, device="cuda", dtype=torch.bfloat16),
        img_ids=img_ids.reshape(-1, 3), txt_ids=torch.zeros(TXT_TOKENS[size], 3, device="cuda"),
        guidance=torch.full((1,), 3.5, device="cuda"), return_dict=False,
    )
    timesteps = [torch.full((1,), 1.0 - i / steps, device="cuda", dtype=torch.bfloat16) for i in range(steps)]
    return common, timesteps


def _time(model, common, timesteps, warmup: int, iters: int) -> float:
    import torch

    for i in range(warmup):
        model(timestep=timesteps[i % len(timesteps)], **common)
    torch.cuda.synchronize()
    times = []
    for i in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        model(timestep=timesteps[i % len(timesteps)], **common)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _ratios(ms: dict) -> dict:
    pairs = [("eager_capture", "eager"), ("eager_capture_model", "eager"), ("inductor_capture", "inductor"),
             ("inductor_capture", "inductor_default"), ("inductor_capture_unsafe", "inductor_default"),
             ("inductor_capture_model", "inductor_default"),
             ("inductor_capture_model", "inductor_model"), ("eager_capture", "inductor_default")]
    return {f"{a}/{b}": ms[a] / ms[b] for a, b in pairs if a in ms and b in ms}


def run(layers: int = 2, single_layers: int = 4, iters: int = 20, warmup: int = 5, sizes=tuple(SIZES),
        configs=tuple(CONFIGS)) -> dict:
    import torch

    import diffusers_ascend

    if not torch.cuda.is_available():
        raise SystemExit(
            "benchmarks/graph_capture.py needs a CUDA GPU (it measures CUDA graphs); none is available here. "
            "Run it on a GPU host; NPUGraph capture on Ascend is not measured by this script."
        )
    model = _model(layers, single_layers)
    result = {
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "dtype": "bfloat16",
        "model": f"FluxTransformer2DModel full width (3072), {layers} double + {single_layers} single blocks, random weights",
        "configs": {name: CONFIGS[name] for name in configs}, "iters": iters, "warmup": warmup, "sizes": {},
    }
    with torch.no_grad():
        for size in sizes:
            common, timesteps = _inputs(size, steps=max(iters, warmup))
            ms = {"uncompiled": _time(model, common, timesteps, warmup, iters)}
            ref = model(timestep=timesteps[0], **common)[0].float()
            diff = {}
            for name in configs:
                overrides = CONFIGS[name]
                torch._dynamo.reset()
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
                        ms[name + "_fallbacks"] = report.fallbacks
                    diffusers_ascend.disable_ascend_compile(model)
            h, w = SIZES[size]
            result["sizes"][size] = {
                "resolution": f"{h}x{w}", "tokens": {"image": (h // 16) * (w // 16), "text": TXT_TOKENS[size]},
                "ms": ms,
                "max_abs_diff_vs_uncompiled": diff,
                "ratios": _ratios(ms),
            }
            torch._dynamo.reset()
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="JSON file to write (default: print only)")
    parser.add_argument("--layers", type=int, default=2, help="double-stream blocks (Flux.1 has 19)")
    parser.add_argument("--single-layers", type=int, default=4, help="single-stream blocks (Flux.1 has 38)")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    args = parser.parse_args(argv)
    result = run(args.layers, args.single_layers, args.iters, args.warmup, tuple(args.sizes), tuple(args.configs))
    text = json.dumps(result, indent=2, default=str)
    print(f"{result['gpu']}, torch {result['torch']}, {result['model']}")
    for size, r in result["sizes"].items():
        print(f"\n{size} ({r['resolution']})")
        for name, ms in r["ms"].items():
            if isinstance(ms, float):
                print(f"  {name:<26} {ms:8.3f} ms   max |diff| {r['max_abs_diff_vs_uncompiled'].get(name, 0.0):.4g}")
        for name, ratio in r["ratios"].items():
            print(f"  {name:<42} {ratio:.3f}")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
