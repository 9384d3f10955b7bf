"""Cold compile time: per-block vs whole-model compilation of a Flux-shaped model.

    python benchmarks/compile_time.py --size small --out benchmarks/results/
"""

import sys

from _cli import main

if __name__ == "__main__":
    sys.exit(main(["compile_time"], __doc__.splitlines()[0], "compile_time"))
