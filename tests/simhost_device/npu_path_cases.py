"""The user's path on tensors whose device is ``npu`` (the simulated device): CONTRACT tests, not hardware.

Run only in a process of its own, with the device's plugin (test_npu_device.py does)::

    python -m pytest -p tests.simhost_device.plugin tests/simhost_device/npu_path_cases.py

The process is the simulated Ascend host at device level (`npu_device.npu_device_host`): the
stand-in torch_npu, the ``npu`` device over host memory, ``torch.npu`` with the NPUGraph stand-in,
and the product's own platform detection, provider device types and graph API (nothing widened
to CPU tensors). Each test moves a tiny pipeline ``.to("npu")``, runs it, and compares it with
the same pipeline eager on the CPU.
"""

from __future__ import annotations

import pytest
import torch

import diffusers_ascend
from diffusers_ascend.tiny import flux_pipeline_inputs, tiny_flux_pipeline

from .npu_device import fallback_count, installed, npu_device_host

BF16 = torch.bfloat16
FP32_TOL = dict(atol=1e-4, rtol=1e-4)  # the npu rope tables are fp32 where the CPU's are fp64 (diffusers' npu branch)
BF16_TOL = dict(atol=5e-2, rtol=5e-2)  # 2 bf16 denoising steps through a VAE, as tests/integration/test_composition.py
FIA = "npu_fused_infer_attention_score_v2"


@pytest.fixture(scope="module")
def host():
    from _pytest.monkeypatch import MonkeyPatch

    if not installed():
        pytest.skip("needs the simulated npu device: run with -p tests.simhost_device.plugin in its own process")
    mp = MonkeyPatch()
    try:
        with npu_device_host(mp) as h:
            yield h
    finally:
        mp.undo()


@pytest.fixture(autouse=True)
def _fresh(host):
    torch._dynamo.reset()
    host.torch_npu.calls.clear()
    yield
    torch._dynamo.reset()


def npu_inputs(dtype=torch.float32, **kw):
    return {
        k: v.to("npu") if isinstance(v, torch.Tensor) else v for k, v in flux_pipeline_inputs(dtype=dtype, **kw).items()
    }


@pytest.fixture(scope="module")
def cpu_eager():
    """The tiny Flux pipeline's images, eager on the CPU, per dtype."""
    return {
        dtype: tiny_flux_pipeline(dtype=dtype)(**flux_pipeline_inputs(dtype=dtype)).images
        for dtype in (torch.float32, BF16)
    }


def on_npu(pipe):
    pipe.to("npu")
    devices = {p.device.type for c in (pipe.transformer, pipe.vae) for p in c.parameters()}
    assert devices == {"npu"}, devices
    return pipe


def assert_npu_tensors(calls):
    """Every tensor a stand-in torch_npu op received was on the npu device."""
    seen = [v for _, bound in calls for v in bound.values() if isinstance(v, torch.Tensor)]
    assert seen and {t.device.type for t in seen} == {"npu"}, {t.device for t in seen}


def test_device_is_npu_and_refuses_float64(host):
    from diffusers_ascend.platform import current_platform, platform_info

    assert current_platform() == "npu" and not platform_info()["overridden"]  # detected, not overridden
    assert torch.accelerator.current_accelerator().type == "npu"
    x = torch.ones(2, 3, device="npu")
    assert x.device == torch.device("npu", 0) and x.is_npu
    for make in (
        lambda: torch.zeros(2, dtype=torch.float64, device="npu"),
        lambda: x.double(),
        lambda: torch.ones(2, dtype=torch.float64).to("npu"),
        lambda: x.to(torch.complex128),
        lambda: torch.ones(4, device="npu").view(torch.float64),
        lambda: x.sum(dtype=torch.float64),
    ):
        with pytest.raises(RuntimeError, match="does not support (Double|ComplexDouble).*float64"):
            make()
    with pytest.raises(RuntimeError, match="same device.*npu:0 and cpu"):
        x + torch.ones(2, 3)
    torch.testing.assert_close((x * 2 + torch.tensor(1.0)).cpu(), torch.full((2, 3), 3.0))  # a CPU scalar is taken
    before = torch.npu.memory_allocated()
    y = torch.empty(1000, device="npu")
    assert torch.npu.memory_allocated() - before == 4000
    del y
    assert torch.npu.memory_allocated() == before
    compiled = torch.compile(lambda a: torch.nn.functional.gelu(a) * 2, backend="aot_eager")
    assert compiled(x).device.type == "npu"  # dynamo asks the device for its stream: the hooks answer


def _on(device, inputs: dict) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def test_two_devices_as_on_a_two_card_host(host):
    """npu:0 and npu:1 are distinct devices (memory, current device, ops); an index the host lacks is
    refused with torch_npu's error (aclrtSetDevice: 107001, invalid device ID), never placed on npu:0."""
    assert torch.npu.device_count() == 2 == torch.accelerator.device_count()
    a, b = torch.ones(2, device="npu:0"), torch.ones(2, device="npu:1")
    assert (a.device, b.device) == (torch.device("npu", 0), torch.device("npu", 1))
    assert (b * 2 + 1).device == b.device and torch.arange(3, device="npu:1").device == b.device
    assert b.to("npu:0").device == a.device and a.to("npu:1").device == b.device
    torch.testing.assert_close(b.to("npu:0").cpu(), torch.ones(2))
    with pytest.raises(RuntimeError, match="same device, but found at least two devices, npu:0 and npu:1"):
        a + b
    invalid = r"(?s)error code is 107001.*Invalid device ID.*got npu:[23]"
    for make in (
        lambda: torch.ones(1, device="npu:3"),
        lambda: a.to("npu:3"),
        lambda: torch.empty(2, 2, device=torch.device("npu", 2)),
        lambda: torch.npu.set_device(2),
        lambda: torch.npu.memory_allocated("npu:3"),
    ):
        with pytest.raises(RuntimeError, match=invalid):
            make()
    assert torch.npu.current_device() == 0  # nothing above moved the current device
    before = [torch.npu.memory_allocated(i) for i in (0, 1)]
    y = torch.empty(1000, device="npu:1")
    assert [torch.npu.memory_allocated(i) - was for i, was in zip((0, 1), before)] == [0, 4000]
    del y
    with torch.npu.device(1):  # the current device is where an index-less "npu" tensor goes
        assert torch.npu.current_device() == 1 and torch.empty(1, device="npu").device == b.device
    assert torch.empty(1, device="npu").device == a.device


def test_model_on_npu1_refuses_inputs_on_npu0(host):
    """A tiny Flux transformer on npu:1 runs inputs on npu:1 (its output equal to CPU eager, on npu:1),
    eager and with our compile, and refuses inputs left on npu:0, as a real multi-card host does."""
    from diffusers_ascend.tiny import flux_model_inputs, tiny_flux_transformer

    inputs = flux_model_inputs()
    want = tiny_flux_transformer()(**inputs)[0]
    model = tiny_flux_transformer().to("npu:1")
    assert {p.device for p in model.parameters()} == {torch.device("npu", 1)}
    out = model(**_on("npu:1", inputs))[0]
    assert out.device == torch.device("npu", 1)
    torch.testing.assert_close(out.cpu(), want, **FP32_TOL)
    with pytest.raises(RuntimeError, match="same device, but found at least two devices, npu:[01] and npu:[01]"):
        model(**_on("npu:0", inputs))
    # Our compile on npu:1: the providers' torch_npu calls get npu:1 tensors, the output stays there.
    diffusers_ascend.enable_ascend_compile(model, fusions="all")
    out = model(**_on("npu:1", inputs))[0]
    assert out.device == torch.device("npu", 1)
    torch.testing.assert_close(out.cpu(), want, **FP32_TOL)
    calls = [c for c in host.torch_npu.calls if c[0] != "npu_fusion_attention"]
    devices = {v.device for _, bound in calls for v in bound.values() if isinstance(v, torch.Tensor)}
    assert calls and devices == {torch.device("npu", 1)}, devices


def test_fusions_all_two_steps_match_cpu_eager(host, cpu_eager):
    pipe = on_npu(tiny_flux_pipeline())
    pipe.enable_ascend_compile(fusions="all")
    ran = fallback_count()
    out = pipe(**npu_inputs()).images
    assert out.device.type == "npu" and fallback_count() > ran  # the ops ran on the device's kernels
    torch.testing.assert_close(out.cpu(), cpu_eager[torch.float32], **FP32_TOL)
    report = pipe.ascend_report()
    assert report.swaps == {"rope": 2, "rms_norm": 6, "gelu_tanh": 3} and not report.fallbacks
    names = host.torch_npu.names()
    # per step (1 double + 1 single block): 6 qk norms, rope on q and k of 2 attentions, 3 tanh-GELUs; an fp32
    # model's attention "auto" is SDPA (diffusers declares _native_npu bf16/fp16 only): no npu_fusion_attention
    assert [names.count(n) for n in ("npu_rms_norm", "npu_rotary_mul", "npu_gelu", "npu_fusion_attention")] == [
        12,
        8,
        6,
        0,
    ]
    assert_npu_tensors([c for c in host.torch_npu.calls if c[0] != "npu_fusion_attention"])


def test_fusions_auto_matches_cpu_eager(host, cpu_eager):
    pipe = on_npu(tiny_flux_pipeline())
    pipe.enable_ascend_compile()  # fusions, attention and executor "auto": the NPU's choices
    cfg = pipe.transformer._ascend_state.config
    assert cfg.resolved_executor() == "eager"
    out = pipe(**npu_inputs()).images
    torch.testing.assert_close(out.cpu(), cpu_eager[torch.float32], **FP32_TOL)
    assert set(pipe.ascend_report().swaps) == {"rope", "rms_norm"}  # gelu_tanh is one kernel unfused on NPU
    procs = diffusers_ascend.attention.processors(pipe.transformer)
    assert {p._attention_backend.value for p in procs} == {"native"}  # fp32: _native_npu is bf16/fp16 only
    assert "npu_fusion_attention" not in host.torch_npu.names()


def test_attention_npu_fia_bf16_matches_cpu_eager(host, cpu_eager):
    pipe = on_npu(tiny_flux_pipeline(dtype=BF16))
    pipe.enable_ascend_compile(fusions="all", attention="npu_fia")
    out = pipe(**npu_inputs(BF16)).images
    assert out.device.type == "npu"
    torch.testing.assert_close(out.float().cpu(), cpu_eager[BF16].float(), **BF16_TOL)
    names = host.torch_npu.names()
    assert names.count(FIA) == 4 and "npu_fusion_attention" not in names  # 2 blocks x 2 steps
    assert not pipe.ascend_report().fallbacks


def test_compile_model_matches_cpu_eager(host, cpu_eager):
    pipe = on_npu(tiny_flux_pipeline())
    pipe.enable_ascend_compile(fusions="all", compile="model", executor="eager")
    out = pipe(**npu_inputs()).images
    torch.testing.assert_close(out.cpu(), cpu_eager[torch.float32], **FP32_TOL)
    report = pipe.ascend_report()
    assert len(report.graphs) >= 1 and not report.fallbacks
    assert host.torch_npu.names().count("npu_rms_norm") == 12


def test_graph_capture_on_npu_replays_equal_cpu_eager(host, cpu_eager):
    from diffusers_ascend.platform import graph_api

    api = graph_api()
    assert api.device_type == "npu" and api.graph_class is torch.npu.NPUGraph  # the product's NPU branch
    pipe = on_npu(tiny_flux_pipeline(dtype=BF16))
    pipe.enable_ascend_compile(graph_capture="graph_with_compile")  # attention auto -> npu_fia under capture
    out = pipe(**npu_inputs(BF16)).images
    torch.testing.assert_close(out.float().cpu(), cpu_eager[BF16].float(), **BF16_TOL)
    stats = pipe.transformer._ascend_state.backend.graph_capture.stats
    n_blocks = len(pipe.transformer._ascend_state.compiled)
    assert stats["captures"] >= n_blocks and stats["replays"] > 0 and not pipe.ascend_report().fallbacks
    captures = stats["captures"]
    again = pipe(**npu_inputs(BF16)).images  # same shapes: replays only
    torch.testing.assert_close(again, out, atol=0, rtol=0)
    assert stats["captures"] == captures
    names = host.torch_npu.names()
    assert FIA in names and "npu_fusion_attention" not in names


def test_disable_restores_eager(host, cpu_eager):
    pipe = on_npu(tiny_flux_pipeline())
    pipe.enable_ascend_compile(fusions="all")
    pipe(**npu_inputs(steps=1))
    pipe.disable_ascend_compile()
    host.torch_npu.calls.clear()
    out = pipe(**npu_inputs()).images
    torch.testing.assert_close(out.cpu(), cpu_eager[torch.float32], **FP32_TOL)
    assert host.torch_npu.names() == [] and not hasattr(pipe.transformer, "_ascend_state")


def test_save_and_load_onto_npu(host, cpu_eager, tmp_path):
    pipe = on_npu(tiny_flux_pipeline())
    pipe.enable_ascend_compile(fusions="all")
    pipe.save_pretrained(tmp_path)
    none = dict(text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None)
    loaded = on_npu(type(pipe).from_pretrained(tmp_path, **none))  # enabled from the saved config
    assert loaded.transformer._ascend_state.config == pipe.transformer._ascend_state.config
    out = loaded(**npu_inputs()).images
    torch.testing.assert_close(out.cpu(), cpu_eager[torch.float32], **FP32_TOL)
    assert loaded.ascend_report().swaps == {"rope": 2, "rms_norm": 6, "gelu_tanh": 3}


def test_warm_start_save_refused_on_eager_executor(host, tmp_path):
    """Eager packages are torch.export programs; exporting a block whose tensors are on this test
    device fails inside torch.export (a storage set across devices: the test device's limit, see
    docs/simulated-npu-device.md). The save says so per block and refuses with nothing written."""
    pipe = on_npu(tiny_flux_pipeline())
    pipe.enable_ascend_compile(fusions="all")  # executor "auto": eager on NPU
    pipe(**npu_inputs(steps=1))
    target = tmp_path / "cache"
    with (
        pytest.warns(UserWarning, match="was not packaged") as record,
        pytest.raises(ValueError, match="no block call could be packaged"),
    ):
        pipe.save_ascend_cache(target)
    assert any("storage" in str(w.message) for w in record)  # the real cause, named
    assert not target.exists()
