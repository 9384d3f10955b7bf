"""Every benchmark (ops per block, compile time, recompiles, latency); writes results.json/.md/.png.

    python benchmarks/run_all.py --size small --out benchmarks/results/
"""

import sys

from _cli import main

if __name__ == "__main__":
    sys.exit(main(None, __doc__.splitlines()[0], "results"))
