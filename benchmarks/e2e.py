"""A real-size model through the stock pipeline's denoising loop, per variant (``diffusers-ascend bench e2e``).

    python benchmarks/e2e.py --model flux --depth 1 --height 128 --width 128 --steps 2 --text-len 64 --out benchmarks/results/

Same arguments as ``diffusers-ascend bench e2e`` (``--help`` lists them); docs/benchmarks.md section 7.
"""

import sys

from diffusers_ascend.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "e2e", *sys.argv[1:]]))
