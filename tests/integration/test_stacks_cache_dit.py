"""cache-dit 1.5.3 with us, as its users run it (tiny Flux pipeline, CPU):

- its NPU compile call, ``torch.compile(transformer, backend=MindieSDBackend(), dynamic=True)``
  after its cache hooks (cache-dit PR #1004, ``cache_dit/compile/utils.py: mindiesd_compile``), with
  our backend in MindIE SD's place: DBCache, and DBCache with its TaylorSeer calibrator;
- cache-dit's DBCache, then ``pipe.enable_ascend_compile(...)``.

Each: fused (exact counts), the same steps cached, images equal to the same stack without us.
The backend is a parameter (`BACKENDS`): the object, and the name (``backend="ascend",
options={...}``, the report read back with ``compiled_report``). Importing cache-dit patches diffusers' classes for the rest of the process, so the
cases run in one subprocess per backend form.
"""

from __future__ import annotations

import importlib.util

import pytest

from tests.integration._fresh_process import run_json

pytestmark = pytest.mark.skipif(importlib.util.find_spec("cache_dit") is None, reason="cache-dit is not installed")

# form -> Python expression (in the subprocess) for torch.compile's backend keywords.
BACKENDS = {
    "object": "object_backend()",  # AscendBackend(AscendConfig(fusions="all", executor="eager"))
    "by_name": 'dict(backend="ascend", options=dict(fusions="all", executor="eager"))',
}
CASES = ("npu_compile_call-dbcache", "npu_compile_call-taylorseer", "enable_ascend_compile-dbcache")
STEPS = 6

_SCRIPT = """
import json, sys, torch
from ascend_kernels.testing import assert_close
from diffusers_ascend.benchmarks.bench_cache_dit import cache_dit_flux, object_backend

out = {}
for case in sys.argv[2:]:
    how, cache = case.split("-")
    calibrator = cache == "taylorseer"
    torch.compiler.reset()
    alone = cache_dit_flux("cache_dit", steps=STEPS, calibrator=calibrator)
    kwargs = (BACKEND) if how == "npu_compile_call" else None
    got = cache_dit_flux(how, steps=STEPS, calibrator=calibrator, compile_kwargs=kwargs)
    try:
        assert_close(got["images"], alone["images"], dtype=torch.float32)
        close = None
    except AssertionError as e:
        close = str(e)[-500:]
    report = got["report"]
    out[case] = dict(
        mismatch=close, max_diff=float((got["images"] - alone["images"]).abs().max()),
        cached=got["cached_steps"], cached_alone=alone["cached_steps"],
        matches={f: n for f, n in report.matches.items() if n} if report is not None else None,
        swaps=dict(report.swaps) if report is not None else None,
        fallbacks=[fb.reason for fb in report.fallbacks] if report is not None else None,
        graphs=report.graphs_compiled if report is not None else None,
    )
print(json.dumps(out))
"""


@pytest.fixture(scope="module", params=list(BACKENDS))
def results(request):
    script = _SCRIPT.replace("(BACKEND)", BACKENDS[request.param]).replace("STEPS", str(STEPS))
    return run_json(script, request.param, *CASES, timeout=900)


# The graph fusions made, per case. Under the NPU compile call the whole transformer is one dynamo
# frame with cache-dit's hooks in it: its cache decisions break the graph (11 graphs here) and the
# patterns are matched in the pieces, our layer swaps not applied (that call swaps nothing), so the
# graph passes fuse the norms, ropes and GELUs too. Under enable_ascend_compile the layers are swapped
# and each block compiles on its own (2 graphs), below cache-dit's block wrapper.
EXPECTED = {
    "npu_compile_call-dbcache": ({"rms_norm": 6, "rope": 4, "gelu_tanh": 3, "adaln": 7, "mul_add": 5}, {}),
    "npu_compile_call-taylorseer": ({"rms_norm": 6, "rope": 4, "gelu_tanh": 3, "adaln": 7, "mul_add": 5}, {}),
    "enable_ascend_compile-dbcache": ({"adaln": 5, "mul_add": 5}, {"rope": 2, "rms_norm": 6, "gelu_tanh": 3}),
}


@pytest.mark.parametrize("case", CASES)
def test_cache_dit_with_our_backend_is_fused_and_equals_cache_dit_alone(results, case):
    got = results[case]
    assert got["mismatch"] is None, got
    assert got["cached_alone"], "DBCache cached no step: the case tests nothing"
    assert got["cached"] == got["cached_alone"]  # the same cache decisions
    assert got["fallbacks"] == []
    matches, swaps = EXPECTED[case]
    assert got["matches"] == matches, got
    assert got["swaps"] == swaps, got
