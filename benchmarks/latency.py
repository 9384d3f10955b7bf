"""Steady-state CPU latency: eager, whole-model Inductor, enable_ascend_compile.

    python benchmarks/latency.py --size small --out benchmarks/results/
"""

import sys

from _cli import main

if __name__ == "__main__":
    sys.exit(main(["latency"], __doc__.splitlines()[0], "latency"))
