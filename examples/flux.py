"""FLUX.1 with diffusers-ascend (needs the weights: accept the license on the Hub first).

python examples/flux.py --device npu --prompt "a cat in a hat"
"""

import argparse

import torch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="black-forest-labs/FLUX.1-dev")
    p.add_argument("--device", default="npu", choices=["npu", "cuda", "cpu"])
    p.add_argument("--prompt", default="a photo of an astronaut riding a horse")
    p.add_argument("--steps", type=int, default=28)
    p.add_argument("--height", type=int, default=1024)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--fusions", default="auto", help="auto | all | none | comma-separated fusion names")
    p.add_argument("--output", default="flux.png")
    args = p.parse_args()
    if args.device == "npu":
        import torch_npu  # noqa: F401
    from diffusers import FluxPipeline

    import diffusers_ascend  # noqa: F401

    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    pipe = FluxPipeline.from_pretrained(args.model, torch_dtype=dtype).to(args.device)
    pipe.enable_ascend_compile(
        fusions=args.fusions if args.fusions in ("auto", "all", "none") else args.fusions.split(",")
    )
    image = pipe(args.prompt, num_inference_steps=args.steps, height=args.height, width=args.width).images[0]
    image.save(args.output)
    print(pipe.ascend_report())


if __name__ == "__main__":
    main()
