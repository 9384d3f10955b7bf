"""Shared command line of the benchmark scripts in this directory."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, Sequence

# A script's own arguments: adds them to the parser, returns args -> `run_benchmarks` options.
ExtraArgs = Callable[[argparse.ArgumentParser], Callable[[argparse.Namespace], dict[str, dict[str, Any]]]]


def main(names: Sequence[str] | None, description: str, stem: str, argv: Sequence[str] | None = None,
         extra: ExtraArgs | None = None) -> int:
    parser = argparse.ArgumentParser(description=description)
    # The sizes of diffusers_ascend.benchmarks.SIZES, spelled out so --help does not import torch.
    parser.add_argument("--size", default="small", choices=("tiny", "small"),
                        help="tiny: seconds (smoke test); small: the real benchmark (minutes on CPU)")
    parser.add_argument("--out", default=None, help=f"directory for {stem}.json/.md/.png (default: print only)")
    options_of = extra(parser) if extra else (lambda args: {})
    args = parser.parse_args(argv)
    from diffusers_ascend.benchmarks import run_benchmarks, write_results

    results = run_benchmarks(names, size=args.size, options=options_of(args))
    if args.out:
        paths = write_results(results, args.out, stem=stem)
        print("wrote " + ", ".join(paths.values()))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(None, "all benchmarks", "results"))
