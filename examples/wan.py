"""Wan 2.1 text-to-video with diffusers-ascend (needs the weights).

python examples/wan.py --device npu --prompt "a cat walking on grass"
"""

import argparse

import torch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="Wan-AI/Wan2.1-T2V-1.3B-Diffusers")
    p.add_argument("--device", default="npu", choices=["npu", "cuda", "cpu"])
    p.add_argument("--prompt", default="a cat walking on grass, realistic")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--height", type=int, default=480)
    p.add_argument("--width", type=int, default=832)
    p.add_argument("--frames", type=int, default=33)
    p.add_argument("--fusions", default="auto", help="auto | all | none | comma-separated fusion names")
    p.add_argument("--output", default="wan.mp4")
    args = p.parse_args()
    if args.device == "npu":
        import torch_npu  # noqa: F401
    from diffusers import AutoencoderKLWan, WanPipeline
    from diffusers.utils import export_to_video

    import diffusers_ascend  # noqa: F401

    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    vae = AutoencoderKLWan.from_pretrained(args.model, subfolder="vae", torch_dtype=torch.float32)
    pipe = WanPipeline.from_pretrained(args.model, vae=vae, torch_dtype=dtype).to(args.device)
    pipe.enable_ascend_compile(
        fusions=args.fusions if args.fusions in ("auto", "all", "none") else args.fusions.split(",")
    )
    frames = pipe(
        args.prompt, height=args.height, width=args.width, num_frames=args.frames, num_inference_steps=args.steps
    ).frames[0]
    export_to_video(frames, args.output, fps=16)
    print(pipe.ascend_report())


if __name__ == "__main__":
    main()
