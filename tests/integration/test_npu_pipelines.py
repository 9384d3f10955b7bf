"""The pipeline path on a real Ascend NPU: what a 910B owner runs to confirm the integration.

    pytest -m npu tests/integration/test_npu_pipelines.py

Skipped everywhere else (``tests/conftest.py``); nothing here has run yet, since no NPU was
available to the authors. Each test mirrors a CPU test of this directory on ``"npu"`` in bf16:
``fusions="auto"`` must pick the torch_npu-backed fusions, the attention backend must become
``_native_npu``, and the output must stay within bf16 tolerance of eager on the same device.
"""

from __future__ import annotations

import pytest
import torch

import diffusers_ascend  # noqa: F401
from diffusers_ascend.tiny import flux_pipeline_inputs, tiny_flux_pipeline, tiny_wan_pipeline, wan_pipeline_inputs

pytestmark = pytest.mark.npu
BF16 = dict(atol=5e-2, rtol=5e-2)  # 2 denoising steps through a VAE, as tests/integration/test_composition.py


def _on_npu(pipe):
    return pipe.to("npu", torch.bfloat16)


def _npu_inputs(make):
    return {k: v.to("npu") if isinstance(v, torch.Tensor) else v for k, v in make(dtype=torch.bfloat16).items()}


def test_platform_and_auto_resolution():
    from ascend_kernels.npu import kernels, mindiesd_available, probe
    from diffusers_ascend import AscendConfig
    from diffusers_ascend.platform import current_platform

    assert current_platform() == "npu"
    # From the provider registry: gelu_tanh is one kernel unfused on NPU; adaLN needs MindIE SD; swiglu
    # Atlas A2 with aclnnSwiGlu.
    expected = (
        ("rms_norm", "rope")
        + (("adaln",) if mindiesd_available() else ())
        + ("mul_add",)
        + (("swiglu",) if kernels.swiglu_kernel() else ())
        # torch_npu's quantized matmuls, documented for A2/A3 (#44)
        + (("int8_dynamic_linear", "int8_weight_only_linear") if probe.is_a2_a3() else ())
    )
    assert AscendConfig().resolved_fusions() == expected
    assert AscendConfig().resolved_executor() == "eager"


@pytest.mark.parametrize("kind", ["flux", "wan"])
def test_auto_on_npu_matches_eager(kind):
    build, inputs, attr = (
        (tiny_flux_pipeline, flux_pipeline_inputs, "images")
        if kind == "flux"
        else (tiny_wan_pipeline, wan_pipeline_inputs, "frames")
    )
    eager, pipe = _on_npu(build()), _on_npu(build())
    ref = getattr(eager(**_npu_inputs(inputs)), attr)
    pipe.enable_ascend_compile()  # fusions="auto", attention="auto", executor="auto" (eager on NPU)
    out = getattr(pipe(**_npu_inputs(inputs)), attr)
    torch.testing.assert_close(out.float().cpu(), ref.float().cpu(), **BF16)
    report = pipe.ascend_report()
    assert not report.fallbacks
    assert {"rms_norm", "rope"} <= set(report.swaps) and "gelu_tanh" not in report.swaps
    procs = [m.processor for m in pipe.transformer.modules() if hasattr(m, "processor")]
    assert procs and all(
        str(p._attention_backend) in ("_native_npu", "AttentionBackendName._NATIVE_NPU") for p in procs
    )


def test_all_fusions_and_freezing_on_npu():
    eager, pipe = _on_npu(tiny_flux_pipeline()), _on_npu(tiny_flux_pipeline())
    ref = eager(**_npu_inputs(flux_pipeline_inputs)).images
    pipe.enable_ascend_compile(fusions="all", compile="model", freezing=True)
    out = pipe(**_npu_inputs(flux_pipeline_inputs)).images
    torch.testing.assert_close(out.float().cpu(), ref.float().cpu(), **BF16)
    assert not pipe.ascend_report().fallbacks
