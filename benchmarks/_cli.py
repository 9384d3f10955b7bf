"""Shared command line of the benchmark scripts in this directory."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence


def main(names: Sequence[str] | None, description: str, stem: str, argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=description)
    # The sizes of diffusers_ascend.benchmarks.SIZES, spelled out so --help does not import torch.
    parser.add_argument("--size", default="small", choices=("tiny", "small"),
                        help="tiny: seconds (smoke test); small: the real benchmark (minutes on CPU)")
    parser.add_argument("--out", default=None, help=f"directory for {stem}.json/.md/.png (default: print only)")
    args = parser.parse_args(argv)
    from diffusers_ascend.benchmarks import run_benchmarks, write_results

    results = run_benchmarks(names, size=args.size)
    if args.out:
        paths = write_results(results, args.out, stem=stem)
        print("wrote " + ", ".join(paths.values()))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(None, "all benchmarks", "results"))
