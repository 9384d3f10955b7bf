"""The zoo's coverage on the simulated Ascend host beside the CPU's: CONTRACT tests, not hardware.

`load` reads tests/simhost/zoo_npu.json, which a run writes (never typed by hand)::

    PYTHONPATH=tests/simhost/site DIFFUSERS_ASCEND_ZOO_RECORD=1 DIFFUSERS_ASCEND_ZOO_OUT=/tmp/zoo-npu \\
        python -m pytest -p no:xdist tests/simhost/test_zoo_npu.py -k zoo_model
    python -m tests.simhost.zoo_npu /tmp/zoo-npu     # writes zoo_npu.json, prints the table

`markdown_table` renders docs/support-matrix.md's "model zoo on the simulated Ascend host" table
from it and from the CPU table (`tests.models.zoo_table.COVERAGE`).
"""

from __future__ import annotations

import glob
import json
import os
import sys

from tests.models.zoo_table import COVERAGE, TINY

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "zoo_npu.json")
# What CI runs on the simulated host (the whole zoo runs by hand, `nox -s simhost-2.10`): the four
# families issue 34 names, and UNet2DConditionModel for diffusers' GEGLU branch (Qwen-Image covers
# its RMSNorm branch). Chosen to keep `.ci/run` under an hour (docs/support-matrix.md).
CI_SUBSET = frozenset(
    {
        "FluxTransformer2DModel",
        "WanTransformer3DModel",
        "QwenImageTransformer2DModel",
        "ChromaTransformer2DModel",
        "UNet2DConditionModel",
    }
)


def load() -> dict:
    """Model name -> coverage (``matches``, ``swaps``, ``left``, ``upstream_fused``) on the simulated host."""
    if not os.path.exists(PATH):
        return {}
    with open(PATH) as f:
        return json.load(f)


def record(out_dir: str) -> dict:
    """Merges the per-model JSON files a recording run wrote into tests/simhost/zoo_npu.json."""
    table = load()
    for path in sorted(glob.glob(os.path.join(out_dir, "*.json"))):
        with open(path) as f:
            table[os.path.basename(path)[:-5]] = json.load(f)
    with open(PATH, "w") as f:
        json.dump(dict(sorted(table.items())), f, indent=1, sort_keys=True)
        f.write("\n")
    return table


def _sites(coverage: dict | None) -> str:
    if coverage is None:
        return "not run"
    fusions = sorted(set(coverage["matches"]) | set(coverage["swaps"]))
    cells = []
    for f in fusions:
        m, s = coverage["matches"].get(f, 0), coverage["swaps"].get(f, 0)
        cells.append(f"{f} {m}" + (f" (+{s} swapped)" if s else ""))
    return ", ".join(cells) or "-"


def markdown_table() -> str:
    """The table of docs/support-matrix.md: our fused sites on CPU and on the simulated Ascend host,
    what diffusers fuses itself there, what is left unfused there."""
    npu = load()
    lines = [
        "| model | ours, CPU | ours, simulated NPU host | fused by diffusers (NPU host) | left unfused (NPU host) |",
        "|---|---|---|---|---|",
    ]
    for name in sorted(TINY):
        t = npu.get(name)
        upstream = ", ".join(f"{k} {v}" for k, v in sorted((t or {}).get("upstream_fused", {}).items())) or "-"
        left = ", ".join(f"{k} {v}" for k, v in sorted((t or {}).get("left", {}).items())) or "-"
        lines.append(f"| `{name}` | {_sites(COVERAGE.get(name))} | {_sites(t)} | {upstream} | {left} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        record(sys.argv[1])
    print(markdown_table())
