"""Cold compile time: per-block vs whole-model compilation of a Flux-shaped model.

    python benchmarks/compile_time.py --size small --out benchmarks/results/
    python benchmarks/compile_time.py --executors eager   # the NPU default executor only (faster)
"""

import sys

from _cli import main


def _executors(parser):
    parser.add_argument("--executors", nargs="+", choices=("eager", "inductor"), default=None,
                        help="executors to measure (default: the size's preset)")
    return lambda args: {"compile_time": {"executors": args.executors}} if args.executors else {}


if __name__ == "__main__":
    sys.exit(main(["compile_time"], __doc__.splitlines()[0], "compile_time", extra=_executors))
