"""The npu providers on a real Ascend NPU, at Flux and Wan sizes (``-m npu``; skipped elsewhere).

Run on a 910B host (see docs/npu-notes.md, "What to run on a 910B and what to send back")::

    pytest -m npu -p no:xdist tests/kernels/test_npu_hardware.py

It writes ``npu-hardware-report.json`` (or ``$ASCEND_KERNELS_NPU_REPORT``): the stack (torch,
torch_npu, CANN, SoC, jit_compile), the provider each op uses and why, and per case the provider,
the ops dispatched per fused call, the device kernels torch_npu's profiler saw (when its trace can
be read), the max error against the native provider on the same device, and median latencies of
the provider and of the native composite, and, where triton-ascend is installed, the error,
device kernels and latency of the Triton kernel of the same call. Nothing here has run yet.

Shapes: Flux.1 at 1024x1024 (4096 image + 512 text tokens, 24 heads x 128, dim 3072, FFN 12288)
and Wan 2.1 14B at 480x832, 81 frames (21 x 30 x 52 = 32760 tokens, 40 heads x 128, dim 5120,
FFN 13824). Each case asserts: the expected provider is chosen, its result is within the op's
per-dtype tolerance of the native provider, and (on A2/A3 with jit_compile=False, the documented
target) the number of ops dispatched per fused call.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import ascend_kernels  # noqa: F401
from ascend_kernels.registry import explain, select_provider, use_providers
from ascend_kernels.testing import tolerance

pytestmark = pytest.mark.npu
ops = torch.ops.ascend_kernels

DEVICE = "npu"  # the module-level knobs let a CPU dry run (stand-in torch_npu) exercise this file
REPEATS = 10
SIZES = {
    "flux": dict(tokens=4608, heads=24, head_dim=128, dim=3072, ffn=12288),
    "wan": dict(tokens=32760, heads=40, head_dim=128, dim=5120, ffn=13824),
}
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
_RECORDS: list[dict] = []


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _randn(*shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype).to(DEVICE)


def _sync():
    if DEVICE == "npu":
        torch.npu.synchronize()


def _target() -> bool:
    """A2/A3 with jit_compile=False: the stack the dispatch counts below are asserted for."""
    from ascend_kernels.npu import probe

    return probe.is_a2_a3() and not probe.jit_compile()


class _Dispatched(TorchDispatchMode):
    """Ops dispatched at the top level (a torch_npu op counts once; views launch nothing)."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        if not func.is_view:
            self.ops.append(str(func.overloadpacket._qualified_op_name).replace("::", "."))
        return func(*args, **(kwargs or {}))


def _device_kernels(fn) -> dict:
    """Device kernels of one call from torch_npu's profiler trace (best effort: the trace layout
    is torch_npu's; anything unreadable is reported, not raised)."""
    try:
        import torch_npu

        fn()
        _sync()
        with torch_npu.profiler.profile(activities=[torch_npu.profiler.ProfilerActivity.NPU]) as prof:
            fn()
            _sync()
        path = os.path.join(tempfile.mkdtemp(prefix="ak_trace_"), "trace.json")
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as f:
            trace = json.load(f)
        events = trace["traceEvents"] if isinstance(trace, dict) else trace
        hw = {
            e["pid"]
            for e in events
            if e.get("ph") == "M"
            and e.get("name") == "process_name"
            and "Ascend Hardware" in str(e.get("args", {}).get("name", ""))
        }
        names = [e["name"] for e in events if e.get("ph") == "X" and e.get("pid") in hw]
        return {"count": len(names), "names": names[:32]}
    except Exception as e:  # noqa: BLE001  (report, never fail the case on the profiler)
        return {"error": f"{type(e).__name__}: {e}"[:300]}


def _median_ms(fn) -> float:
    fn()
    _sync()
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        fn()
        _sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _triton(op: str, args: tuple):
    """The ``triton`` provider where it runs this call here (triton-ascend installed), else None."""
    from ascend_kernels.registry import providers

    p = next((p for p in providers(op) if p.name == "triton"), None)
    return p if p is not None and p.supported(DEVICE) and p.supports_args(*args) else None


def _case(op: str, case: str, args: tuple, expect_provider: str = "npu", expect_ops=None) -> None:
    """Runs ``op(*args)`` through the selected provider and the native one, and through the Triton
    kernel too where triton-ascend is installed (whether it beats the provider chosen, or the
    native composite, is what the report is for); records and asserts."""
    provider = select_provider(op, *args)
    with _Dispatched() as seen:
        out = provider.impl(*args)
    _sync()
    with use_providers(**{op: "native"}):
        ref = getattr(ops, op)(*args)
    _sync()
    tol = tolerance(ref.dtype)
    diff = (out.float() - ref.float()).abs()
    bound = tol["atol"] + tol["rtol"] * ref.float().abs()
    record = {
        "op": op,
        "case": case,
        "provider": provider.name,
        "args": [f"{tuple(a.shape)}:{_name(a.dtype)}" if isinstance(a, torch.Tensor) else repr(a) for a in args],
        "out_dtype": _name(out.dtype),
        "dispatched": seen.ops,
        "max_abs_err_vs_native": diff.max().item(),
        "within_tolerance": bool((diff <= bound).all()),
        "tolerance": tol,
        "device_kernels": _device_kernels(lambda: provider.impl(*args)),
        "provider_ms": _median_ms(lambda: provider.impl(*args)),
    }
    with use_providers(**{op: "native"}):
        record["native_ms"] = _median_ms(lambda: getattr(ops, op)(*args))
    triton = _triton(op, args)
    if triton is not None and triton is not provider:
        t_out = triton.impl(*args)
        _sync()
        t_diff = (t_out.float() - ref.float()).abs()
        record["triton"] = {
            "max_abs_err_vs_native": t_diff.max().item(),
            "within_tolerance": bool((t_diff <= bound).all()),
            "device_kernels": _device_kernels(lambda: triton.impl(*args)),
            "ms": _median_ms(lambda: triton.impl(*args)),
        }
    _RECORDS.append(record)
    assert provider.name == expect_provider, record
    assert record.get("triton", {}).get("within_tolerance", True), record
    assert out.dtype == ref.dtype and out.shape == ref.shape
    assert record["within_tolerance"], record
    if expect_ops is not None and _target():
        # The fused kernel and the number of calls; the casts' op names are torch_npu's business.
        assert len(seen.ops) == len(expect_ops) and set(expect_ops) - {"aten._to_copy"} <= set(seen.ops), record


@pytest.fixture(scope="module", autouse=True)
def report():
    yield _RECORDS
    import torch_npu

    from ascend_kernels.npu import mindiesd_available, probe
    from diffusers_ascend.cli import _cann_version

    path = os.environ.get("ASCEND_KERNELS_NPU_REPORT", "npu-hardware-report.json")
    doc = {
        "torch": torch.__version__,
        "torch_npu": getattr(torch_npu, "__version__", None),
        "cann": _cann_version(),
        "soc": probe.soc_name(),
        "soc_version": probe.soc_version(),
        "jit_compile": probe.jit_compile(),
        "mindiesd": mindiesd_available(),
        "providers": {op: dict(zip(("provider", "why"), explain(op, DEVICE))) for op in ascend_kernels.OPS},
        "cases": _RECORDS,
    }
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, default=str)
    print(f"\nwrote {os.path.abspath(path)} ({len(_RECORDS)} cases)")


def test_provider_table():
    from ascend_kernels.npu import mindiesd_available

    chosen = {op: explain(op, DEVICE)[0] for op in ascend_kernels.OPS}
    assert {
        op: chosen[op] for op in ("rms_norm", "rope", "gelu_tanh", "fast_gelu", "mul_add", "swiglu")
    } == dict.fromkeys(("rms_norm", "rope", "gelu_tanh", "fast_gelu", "mul_add", "swiglu"), "npu")
    assert chosen["adaln_modulate"] == ("npu" if mindiesd_available() else "native")


@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
@pytest.mark.parametrize("w_fp32", [False, True], ids=["w_xdtype", "w_fp32"])
@pytest.mark.parametrize("model", list(SIZES))
def test_rms_norm(model, w_fp32, dtype):
    s = SIZES[model]
    # Flux: per-head q/k norm over head_dim; Wan: norm across heads over dim.
    shape, d = (
        ((1, s["tokens"], s["heads"], s["head_dim"]), s["head_dim"])
        if model == "flux"
        else ((1, s["tokens"], s["dim"]), s["dim"])
    )
    x, w = _randn(*shape, dtype=dtype), _randn(d, dtype=torch.float32 if w_fp32 else dtype, seed=1)
    _case("rms_norm", f"{model} w_fp32={w_fp32}", (x, w, 1e-6, None), expect_ops=["npu.npu_rms_norm"])


@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
@pytest.mark.parametrize("model", list(SIZES))
def test_add_rms_norm(model, dtype):
    """Two outputs: the sum must be exact; the normalized value within tolerance of the native op,
    which normalizes the sum rounded to x's dtype (whether the kernel does is what this records)."""
    s = SIZES[model]
    x1, x2 = _randn(1, s["tokens"], s["dim"], dtype=dtype), _randn(1, s["tokens"], s["dim"], dtype=dtype, seed=1)
    w = _randn(s["dim"], dtype=dtype, seed=2)
    args = (x1, x2, w, 1e-6, None)
    provider = select_provider("add_rms_norm", *args)
    y, total = provider.impl(*args)
    _sync()
    with use_providers(add_rms_norm="native"):
        ref_y, ref_total = ops.add_rms_norm(*args)
    _sync()
    tol = tolerance(dtype)
    err = (y.float() - ref_y.float()).abs()
    _RECORDS.append(
        {
            "op": "add_rms_norm",
            "case": model,
            "provider": provider.name,
            "max_abs_err_vs_native": err.max().item(),
            "sum_exact": bool(torch.equal(total, ref_total)),
            "provider_ms": _median_ms(lambda: provider.impl(*args)),
        }
    )
    assert provider.name == "npu" and torch.equal(total, ref_total)
    assert bool((err <= tol["atol"] + tol["rtol"] * ref_y.float().abs()).all()), _RECORDS[-1]


@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
@pytest.mark.parametrize("fp32_tables", [True, False], ids=["tables_fp32", "tables_xdtype"])
@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("x_layout", ["BSND", "BNSD"])
@pytest.mark.parametrize("model", list(SIZES))
def test_rope(model, x_layout, layout, fp32_tables, dtype):
    s = SIZES[model]
    S, N, D = s["tokens"], s["heads"], s["head_dim"]
    theta = torch.rand(S, D // 2, generator=torch.Generator().manual_seed(2)) * 100
    cos, sin = theta.cos(), theta.sin()
    if layout == "interleaved":  # Flux/Wan tables: each angle twice
        cos, sin = cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)
    else:
        cos, sin = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
    tdt = torch.float32 if fp32_tables else dtype
    cos, sin = cos.to(tdt).to(DEVICE), sin.to(tdt).to(DEVICE)
    if x_layout == "BSND":
        x, c, sn = _randn(1, S, N, D, dtype=dtype), cos[None, :, None], sin[None, :, None]
    else:
        x, c, sn = _randn(1, N, S, D, dtype=dtype), cos[None, None], sin[None, None]
    upcast = tdt != dtype and dtype != torch.float32
    expect = ["aten._to_copy", "npu.npu_rotary_mul", "aten._to_copy"] if upcast else ["npu.npu_rotary_mul"]
    _case("rope", f"{model} {x_layout} {layout} tables={_name(tdt)}", (x, c, sn, layout), expect_ops=expect)


@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
@pytest.mark.parametrize("layout", ["packed", "two_tensors"])
@pytest.mark.parametrize("model", list(SIZES))
def test_swiglu(model, layout, dtype):
    # An FFN activation of the model's size: Flux 2's packed halves, or a separate gate (HiDream).
    s = SIZES[model]
    h = _randn(1, s["tokens"], s["ffn"], dtype=dtype)
    gate, up = h[..., : s["ffn"] // 2].contiguous(), h[..., s["ffn"] // 2 :].contiguous()
    if layout == "packed":
        _case("swiglu", f"{model} packed", (h, None, -1), expect_ops=["npu.npu_swiglu"])
    elif dtype == torch.float32:  # the composite, silu and mul without casts
        _case("swiglu", f"{model} two_tensors", (gate, up, -1), expect_provider="native")
    else:
        _case("swiglu", f"{model} two_tensors", (gate, up, -1), expect_ops=["aten.cat", "npu.npu_swiglu"])
    # What "auto" is weighed against: the unfused silu and mul of the same tensors.
    _RECORDS.append(
        {
            "op": "aten.silu*mul",
            "case": f"{model} {_name(dtype)} unfused",
            "device_kernels": _device_kernels(lambda: F.silu(gate) * up),
            "native_ms": _median_ms(lambda: F.silu(gate) * up),
        }
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
@pytest.mark.parametrize("model", list(SIZES))
def test_gelu_tanh_and_fast_gelu(model, dtype):
    s = SIZES[model]
    x = _randn(1, s["tokens"], s["ffn"], dtype=dtype) * 3
    _case("gelu_tanh", model, (x,), expect_ops=["npu.npu_gelu"])
    _case("fast_gelu", model, (x,), expect_ops=["npu.npu_fast_gelu"])
    # The claim that keeps gelu_tanh out of "auto": the unfused tanh GELU is one kernel on NPU.
    _RECORDS.append(
        {
            "op": "aten.gelu(tanh)",
            "case": f"{model} {_name(dtype)} unfused",
            "device_kernels": _device_kernels(lambda: F.gelu(x, approximate="tanh")),
            "native_ms": _median_ms(lambda: F.gelu(x, approximate="tanh")),
        }
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
@pytest.mark.parametrize("model", list(SIZES))
def test_mul_add(model, dtype):
    s = SIZES[model]
    shape = (1, s["tokens"], s["dim"])
    if model == "flux":  # residual + gate * y, all in the pipeline dtype
        gate, y, res = (
            _randn(1, 1, s["dim"], dtype=dtype),
            _randn(*shape, dtype=dtype, seed=1),
            _randn(*shape, dtype=dtype, seed=2),
        )
    else:  # Wan: fp32 residual stream and gate, y in the pipeline dtype
        gate, y, res = (
            _randn(1, 1, s["dim"], dtype=torch.float32),
            _randn(*shape, dtype=dtype, seed=1),
            _randn(*shape, dtype=torch.float32, seed=2),
        )
    _case("mul_add", model, (gate, y, res), expect_ops=["aten.addcmul"])
    _RECORDS.append(
        {
            "op": "unfused x*y+z",
            "case": f"{model} {_name(dtype)}",
            "device_kernels": _device_kernels(lambda: gate * y + res),
            "native_ms": _median_ms(lambda: gate * y + res),
        }
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
@pytest.mark.parametrize("model", list(SIZES))
def test_adaln(model, dtype):
    from ascend_kernels.npu import mindiesd_available

    s = SIZES[model]
    x = _randn(1, s["tokens"], s["dim"], dtype=dtype)
    mdt = dtype if model == "flux" else torch.float32  # Wan's modulation is fp32
    scale, shift = _randn(1, 1, s["dim"], dtype=mdt, seed=1), _randn(1, 1, s["dim"], dtype=mdt, seed=2)
    upcast = mdt != dtype
    expect = ["aten._to_copy", "mindiesd.adaln", "aten._to_copy"] if upcast else ["mindiesd.adaln"]
    args = (x, scale, shift, 1e-6, None, None, dtype)
    # MindIE SD's kernel first, else the Triton kernel (triton-ascend), else the native composite
    fallback = "triton" if _triton("adaln_modulate", args) is not None else "native"
    _case(
        "adaln_modulate",
        model,
        args,
        expect_provider="npu" if mindiesd_available() else fallback,
        expect_ops=expect if mindiesd_available() else None,
    )


# -- attention: npu_fia (npu_fused_infer_attention_score) vs diffusers' _native_npu (npu_fusion_attention)
# The row `AscendConfig.resolved_attention` waits for: "auto" keeps _native_npu on NPU outside graph
# capture and ring attention until this shows FIA at least as fast at these sizes.
ATTENTION_SIZES = {
    "flux": dict(batch=1, tokens=4608, heads=24, head_dim=128),
    "wan": dict(batch=1, tokens=32760, heads=40, head_dim=128),
}


@pytest.mark.parametrize("return_lse", [False, True], ids=["out", "out_lse"])
@pytest.mark.parametrize("mask", [None, "keys"], ids=["no_mask", "key_mask"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=_name)
@pytest.mark.parametrize("model", list(ATTENTION_SIZES))
def test_attention_fia_vs_native_npu(model, dtype, mask, return_lse):
    from diffusers.models.attention_dispatch import AttentionBackendName, dispatch_attention_fn

    from ascend_kernels.npu.attention import fia_unsupported
    from diffusers_ascend.attention import backend_for

    s = ATTENTION_SIZES[model]
    shape = (s["batch"], s["tokens"], s["heads"], s["head_dim"])
    q, k, v = (_randn(*shape, dtype=dtype, seed=i) for i in range(3))
    m = None
    if mask == "keys":  # padded keys, as TokenBuckets / Qwen-Image's text mask make them
        m = torch.ones(s["batch"], 1, 1, s["tokens"], dtype=torch.bool, device=DEVICE)
        m[..., -s["tokens"] // 8 :] = False
    assert fia_unsupported(q, k, v, m) is None
    fia = lambda: dispatch_attention_fn(  # noqa: E731
        q,
        k,
        v,
        attn_mask=m,
        backend=backend_for("npu_fia"),
        attention_kwargs={"return_lse": True} if return_lse else None,
    )
    native = lambda: dispatch_attention_fn(q, k, v, attn_mask=m, backend=AttentionBackendName._NATIVE_NPU)  # noqa: E731
    out, ref = fia(), native()
    if return_lse:
        out, lse = out
        assert lse.shape == shape[:3] and lse.dtype == torch.float32 and torch.isfinite(lse).all()
    _sync()
    tol = tolerance(dtype)
    diff = (out.float() - ref.float()).abs()
    record = {
        "op": "attention",
        "case": f"{model}:{_name(dtype)}:{mask or 'no_mask'}:{'lse' if return_lse else 'out'}",
        "provider": "npu_fia",
        "args": [f"{shape}:{_name(dtype)}"],
        "max_abs_err_vs_native": diff.max().item(),
        "within_tolerance": bool((diff <= tol["atol"] + tol["rtol"] * ref.float().abs()).all()),
        "tolerance": tol,
        "device_kernels": _device_kernels(fia),
        "provider_ms": _median_ms(fia),
        "native_ms": _median_ms(native),
    }
    _RECORDS.append(record)
    assert record["within_tolerance"], record
