"""Operators dispatched per Flux/Wan block, eager vs fused (fp32, bf16).

    python benchmarks/ops_per_block.py --size small --out benchmarks/results/
"""

import sys

from _cli import main

if __name__ == "__main__":
    sys.exit(main(["ops_per_block"], __doc__.splitlines()[0], "ops_per_block"))
