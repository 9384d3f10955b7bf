"""Runs a script in a fresh Python process with this tree importable: for stacks whose import changes
the process (cache-dit registers attention backends and patches diffusers' classes when imported)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_json(script: str, *argv: str, timeout: float = 600) -> Any:
    """Runs `script` (``python -c``) with `argv`; returns the JSON its last line of output prints.
    A failing script fails the caller with the end of its stderr."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, "-c", script, *argv], capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def join_or_fail(ctx, timeout_s: float) -> None:
    """Waits for the processes of `ctx` (``torch.multiprocessing.start_processes(..., join=False)``);
    past `timeout_s` kills them and fails the test (a hung collective never hangs the suite)."""
    import time

    import pytest

    deadline = time.monotonic() + timeout_s
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"the {len(ctx.processes)} processes did not finish in {timeout_s} s")
