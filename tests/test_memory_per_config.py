"""Memory per distinct config (issue 42): what enabling ever new configs on one model leaves behind.

Dynamo's guards register a ``weakref.finalize`` on each object they match by identity, holding the
guard's ``CheckFunctionManager`` (its guard tree, code parts and user stacks). Most of those objects
(modules, classes, builtins) live as long as the process, so the guard records of every config a
model had compiled outlived its graphs: those of configs dropped beyond the kept ones, and all of
them after ``torch._dynamo.reset()`` and dropping the model. Each config's `CompiledCall` now lets
its records go when its graphs go (`block_compile._release`). A fresh process per test: tracemalloc
and a guard count see no other test's compiles. docs/services.md gives the measured figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

# The subprocess keeps 2 configs per model (`block_compile.KEPT_CONFIGS`, 4 in use: fewer compiles
# here) and enables 3 after a warm-up one, so the oldest is dropped; tiny Flux compiles 2 graphs
# (one per block class) per config.
KEPT, CONFIGS, GRAPHS = 2, 3, 2

_SCRIPT = textwrap.dedent(
    """
    import gc, json, sys, tracemalloc, weakref
    import torch
    import diffusers_ascend
    from torch._dynamo.guards import CheckFunctionManager
    from diffusers_ascend.integration import block_compile
    from diffusers_ascend.tiny import FLUX_TRANSFORMER_CONFIG, flux_model_inputs, tiny_flux_transformer

    LAYERS = dict(num_layers=1, num_single_layers=1)
    FUSIONS = ["rms_norm", "rope", "gelu_tanh", "adaln", "mul_add", "swiglu"]

    def guard_records():
        # dynamo's guard managers that a finalizer keeps alive
        owners = set()
        for info in list(weakref.finalize._registry.values()):
            func = getattr(info.func, "func", info.func)
            if isinstance(getattr(func, "__self__", None), CheckFunctionManager):
                owners.add(id(func.__self__))
        return len(owners)

    def cycle(model, inputs, **cfg):
        diffusers_ascend.enable_ascend_compile(model, executor="eager", **cfg)
        with torch.no_grad():
            model(**inputs)
        diffusers_ascend.disable_ascend_compile(model)
        gc.collect()

    block_compile.KEPT_CONFIGS = int(sys.argv[2])
    model = tiny_flux_transformer(**LAYERS)
    inputs = flux_model_inputs(4, 4, config={**FLUX_TRANSFORMER_CONFIG, **LAYERS}, seed=0)
    cycle(model, inputs, fusions=FUSIONS)  # every pattern registered, torch's one-time caches filled
    torch._dynamo.reset()
    gc.collect()
    base = guard_records()
    tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]
    per_config = []
    for i in range(int(sys.argv[1])):  # distinct configs: each leaves one fusion out, its own limit
        cycle(model, inputs, fusions=[f for f in FUSIONS if f != FUSIONS[i % len(FUSIONS)]], recompile_limit=9 + i)
        per_config.append(guard_records() - base)
    added = tracemalloc.get_traced_memory()[0] - start
    other = tiny_flux_transformer(**LAYERS)  # another model, dropped without a reset
    cycle(other, inputs, fusions=FUSIONS[:1])
    del other
    gc.collect()
    after_drop = guard_records() - base
    torch._dynamo.reset()
    del model
    gc.collect()
    retained = tracemalloc.get_traced_memory()[0] - start
    print("RESULT " + json.dumps({"records": per_config, "records_after_drop": after_drop,
                                  "records_after_reset": guard_records() - base, "added": added, "retained": retained}))
    """
)


@pytest.mark.own_process
def test_configs_enabled_in_turn_leave_no_guard_records_behind_their_graphs():
    env = {**os.environ, "PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(CONFIGS), str(KEPT)], capture_output=True, text=True, env=env, timeout=400
    )
    assert out.returncode == 0, out.stderr[-4000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])
    print(result)  # noqa: T201  (shown with -s: the figures docs/services.md quotes)
    records = result["records"]
    # One guard record per graph the model keeps; a config dropped beyond the kept ones takes its
    # records along (before: 2 more per config, for good).
    assert records == [GRAPHS * min(i + 1, KEPT) for i in range(CONFIGS)], records
    # Another model enabled once and dropped (no reset): its records go with it.
    assert result["records_after_drop"] == records[-1]
    # After torch._dynamo.reset() and dropping the model: none left (before: 2 per config).
    assert result["records_after_reset"] == 0
    # What stays on the heap then is torch's (FX's cache of each graph's generated source, dynamo's
    # compile metrics, the source lines and name caches of the first compiles), not a config's
    # guards: the bound sits between the two figures docs/services.md gives for this run.
    assert result["retained"] < 4 * 2**20, f"{result['retained'] / 2**20:.2f} MiB retained after reset"
