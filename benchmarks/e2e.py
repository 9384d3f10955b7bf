"""A real-size model through the stock pipeline's denoising loop, per variant (``diffusers-ascend bench e2e``).

    python benchmarks/e2e.py --model flux --depth 1 --height 128 --width 128 --steps 2 --text-len 64 --out benchmarks/results/

Same arguments as ``diffusers-ascend bench e2e`` (``--help`` lists them); docs/benchmarks.md section 7.
"""

import os
import sys

# The checkout this script is in, ahead of any installed copy of the package.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from diffusers_ascend.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["bench", "e2e", *sys.argv[1:]]))
