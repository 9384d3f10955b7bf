"""Graphs compiled as the resolution changes under per-block compilation.

    python benchmarks/recompiles.py --size small --out benchmarks/results/
"""

import sys

from _cli import main

if __name__ == "__main__":
    sys.exit(main(["recompiles"], __doc__.splitlines()[0], "recompiles"))
