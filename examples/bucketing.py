"""Multi-resolution serving with a bounded set of captured graphs: pad image tokens to buckets.

    python examples/bucketing.py

A captured graph is specific to its input shapes, so a service that accepts any resolution would
capture a graph per resolution. `TokenBuckets` pads the image-token sequence to the next of a few
lengths, masks the padded keys out of attention, and slices them off the output: every request
replays one of `len(buckets)` graphs and the result equals the unpadded model's.

Runs offline on a tiny seeded Flux transformer. On a CUDA GPU (or an NPU) it enables graph capture
and prints how many graphs were captured; on a CPU there are no device graphs, so it runs the same
padding through the uncompiled model and checks the numerics only.
"""

import torch

import diffusers_ascend
from diffusers_ascend.compilation.graph_capture import TokenBuckets
from diffusers_ascend.integration import enabled_models
from diffusers_ascend.platform import current_platform, graph_capture_supported
from diffusers_ascend.tiny import tiny_flux_transformer


def flux_inputs(height: int, width: int, txt: int, device):
    """Transformer inputs for a `height` x `width` latent grid (already 2x2-patchified)."""
    gen = torch.Generator().manual_seed(height * 100 + width)
    img_ids = torch.zeros(height, width, 3)
    img_ids[..., 1] = torch.arange(height)[:, None]
    img_ids[..., 2] = torch.arange(width)[None, :]
    return dict(
        hidden_states=torch.randn(1, height * width, 4, generator=gen).to(device),
        img_ids=img_ids.reshape(-1, 3).to(device),
        encoder_hidden_states=torch.randn(1, txt, 32, generator=gen).to(device),
        pooled_projections=torch.randn(1, 32, generator=gen).to(device),
        txt_ids=torch.zeros(txt, 3, device=device),
        timestep=torch.tensor([0.5], device=device),
    )


def bucketed_call(model, buckets: TokenBuckets, inputs: dict) -> torch.Tensor:
    """Runs `model` on `inputs` padded to the image-token bucket; returns the unpadded output."""
    hidden, n = buckets.pad(inputs["hidden_states"], dim=1)
    img_ids, _ = buckets.pad(inputs["img_ids"], dim=0)
    txt = inputs["encoder_hidden_states"].shape[1]
    mask = buckets.attention_mask(n, prefix=txt, device=hidden.device)  # text keys + real image keys
    out = model(
        **{**inputs, "hidden_states": hidden, "img_ids": img_ids},
        joint_attention_kwargs={"attention_mask": mask},
        return_dict=False,
    )[0]
    return buckets.unpad(out, n, dim=1)


def main() -> None:
    device = {"cuda": "cuda", "npu": "npu"}.get(current_platform(), "cpu")
    model = tiny_flux_transformer().to(device)
    buckets = TokenBuckets([16, 64])  # image tokens; real services use e.g. [1024, 2304, 4096]
    requests = [(2, 3), (3, 4), (4, 4), (5, 6), (6, 8), (8, 8)]  # 6 resolutions
    with torch.no_grad():
        refs = [model(**flux_inputs(h, w, 8, device), return_dict=False)[0] for h, w in requests]
        if graph_capture_supported():
            # dynamic=False: one static graph per bucket (a dynamic graph gains nothing under capture,
            # whose graphs are per shape anyway). Capture needs a capturable attention on NPU
            # (docs/graph-capture.md); attention=None keeps the model's.
            diffusers_ascend.enable_ascend_compile(
                model, compile="model", dynamic=False, graph_capture="graph_with_compile", attention=None
            )
        for (h, w), ref in zip(requests, refs):
            out = bucketed_call(model, buckets, flux_inputs(h, w, 8, device))
            print(
                f"{h}x{w} latent ({h * w} tokens) -> bucket {buckets.bucket_for(h * w)}: "
                f"max abs diff vs unpadded {(out - ref).abs().max().item():.2e}"
            )
    if graph_capture_supported():
        (info,) = enabled_models(model)
        print(f"{len(requests)} resolutions, {info.captured_graphs} captured graphs, stats {dict(info.capture_stats)}")
    else:
        print(f"no device graphs on {current_platform()!r}: numerics checked, nothing captured")


if __name__ == "__main__":
    main()
