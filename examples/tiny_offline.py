"""Runs in seconds on CPU with no downloads: a tiny seeded Flux pipeline, accelerated, compared with eager.

python examples/tiny_offline.py
"""

import diffusers_ascend  # noqa: F401  (adds enable_ascend_compile to diffusers pipelines)
from diffusers_ascend.tiny import flux_pipeline_inputs, tiny_flux_pipeline


def main() -> None:
    pipe = tiny_flux_pipeline()
    ref = pipe(**flux_pipeline_inputs()).images
    pipe.enable_ascend_compile(fusions="all", executor="eager")
    out = pipe(**flux_pipeline_inputs()).images
    print(pipe.ascend_report())
    print("max abs diff vs eager:", (out - ref).abs().max().item())
    pipe.disable_ascend_compile()


if __name__ == "__main__":
    main()
