"""The ``npu_fia`` attention backend against the stand-in torch_npu (CONTRACT tests, not hardware).

The stand-in FIA (tests/kernels/npu_standins.py) enforces the documented contract (BSND,
fp16/bf16, True = masked out, mask / pse_shift shapes, GQA rules) and computes the documented
result in fp32; the reference here is PyTorch's SDPA in fp32 on the same inputs, with diffusers'
mask convention (True = attend). On a 910B: tests/kernels/test_npu_hardware.py.
"""

from __future__ import annotations

import pickle

import pytest
import torch
import torch.nn.functional as F
from diffusers.models.attention_dispatch import dispatch_attention_fn

from ascend_kernels.testing import TOLERANCES
from diffusers_ascend import AscendConfig
from diffusers_ascend.attention import backend_for
from diffusers_ascend.attention.npu_fia import fallbacks
from tests.kernels.npu_standins import SOC_NAMES

FIA_V1, FIA_V2 = "npu_fused_infer_attention_score", "npu_fused_infer_attention_score_v2"


def _qkv(b=2, sq=32, skv=24, n=4, nkv=None, d=16, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    nkv = nkv or n
    r = lambda *s: torch.randn(*s, generator=g).to(dtype)  # noqa: E731
    return r(b, sq, n, d), r(b, skv, nkv, d), r(b, skv, nkv, d)


def _sdpa(q, k, v, mask=None, scale=None, gqa=False):
    """fp32 reference: SDPA on BNSD, returning BSND output and the LSE [B, S, N]."""
    qf, kf, vf = (t.float().transpose(1, 2) for t in (q, k, v))
    if gqa:
        kf, vf = (t.repeat_interleave(qf.shape[1] // kf.shape[1], dim=1) for t in (kf, vf))
    out = F.scaled_dot_product_attention(qf, kf, vf, attn_mask=mask, scale=scale)
    s = qf @ kf.transpose(-1, -2) * (scale if scale is not None else qf.shape[-1] ** -0.5)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
    return out.transpose(1, 2), torch.logsumexp(s, -1).transpose(1, 2)


def _fia(q, k, v, **kw):
    return dispatch_attention_fn(q, k, v, backend=backend_for("npu_fia"), **kw)


def _close(out, ref, dtype):
    torch.testing.assert_close(out.float(), ref.float(), **TOLERANCES[dtype])


MASKS = {
    "none": lambda b, sq, skv: None,
    "bool_keys": lambda b, sq, skv: torch.rand(b, 1, 1, skv, generator=torch.Generator().manual_seed(1)) > 0.3,
    "bool_full": lambda b, sq, skv: torch.rand(b, 1, sq, skv, generator=torch.Generator().manual_seed(2)) > 0.3,
    "bool_2d": lambda b, sq, skv: torch.rand(sq, skv, generator=torch.Generator().manual_seed(3)) > 0.3,
    "additive": lambda b, sq, skv: torch.randn(b, 1, sq, skv, generator=torch.Generator().manual_seed(4)),
}


@pytest.mark.parametrize("mask", sorted(MASKS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_fia_matches_sdpa_with_masks(simulated_npu, mask, dtype):
    q, k, v = _qkv(dtype=dtype)
    m = MASKS[mask](2, 32, 24)
    if m is not None:
        m[..., 0] = (
            True if m.dtype == torch.bool else m[..., 0]
        )  # fully masked rows: the mask matrix of test_npu_fia_fallbacks
    out = _fia(q, k, v, attn_mask=m)
    _close(out, _sdpa(q, k, v, m)[0], dtype)
    (call,) = simulated_npu.calls(FIA_V2)  # the install has _v2: it is preferred
    assert call["input_layout"] == "BSND" and call["num_query_heads"] == 4 and call["num_key_value_heads"] == 4
    assert call["actual_seq_qlen"] is None and call["actual_seq_kvlen"] is None  # lengths come from the shapes
    if m is None:
        assert call["atten_mask"] is None and call["pse_shift"] is None
    elif m.dtype == torch.bool:  # FIA's polarity: True = masked out, one head, full query length
        assert call["pse_shift"] is None and call["atten_mask"].dtype == torch.bool
        assert torch.equal(
            call["atten_mask"], (~m.reshape((1,) * (4 - m.dim()) + tuple(m.shape))).expand_as(call["atten_mask"])
        )
    else:  # additive: pse_shift, per head, in query's dtype
        assert (
            call["atten_mask"] is None
            and call["pse_shift"].shape == (2, 4, 32, 24)
            and call["pse_shift"].dtype == dtype
        )


def test_fia_v1_schema_when_no_v2(monkeypatch):
    from tests.simulated_npu import simulated_npu_host

    with simulated_npu_host(monkeypatch, fia=("v1",)) as host:
        q, k, v = _qkv()
        out = _fia(q, k, v, scale=0.3)
        _close(out, _sdpa(q, k, v, scale=0.3)[0], torch.bfloat16)
        (call,) = host.calls(FIA_V1)
        assert call["num_heads"] == 4 and call["scale"] == pytest.approx(0.3) and call["softmax_lse_flag"] is False
        assert not host.calls(FIA_V2)


def test_fia_scale_and_gqa(simulated_npu):
    q, k, v = _qkv(n=8, nkv=2, d=32)
    out = _fia(q, k, v, scale=0.1, enable_gqa=True)
    _close(out, _sdpa(q, k, v, scale=0.1, gqa=True)[0], torch.bfloat16)
    (call,) = simulated_npu.calls(FIA_V2)
    assert call["num_query_heads"] == 8 and call["num_key_value_heads"] == 2
    assert call["softmax_scale"] == pytest.approx(0.1)


@pytest.mark.parametrize("mask", ["none", "bool_keys", "additive", "bool_full_dead_row", "additive_dead_row"])
def test_fia_returns_lse_in_diffusers_form(simulated_npu, mask):
    """A fully masked row: SDPA's output there and an LSE of -inf (the log of an empty sum), whatever
    the kernel returned (the stand-in: NaN in both)."""
    q, k, v = _qkv(dtype=torch.float16)
    m = MASKS[mask.removesuffix("_dead_row")](2, 32, 24)
    if m is not None and m.dtype == torch.bool:
        m[..., 0] = True
    if mask.endswith("_dead_row"):  # batch 1, query 5 sees no key
        m[1, :, 5] = False if m.dtype == torch.bool else float("-inf")
    out, lse = _fia(q, k, v, attn_mask=m, attention_kwargs={"return_lse": True})
    ref, ref_lse = _sdpa(q, k, v, m)
    _close(out, ref, torch.float16)
    assert lse.shape == (2, 32, 4) and lse.dtype == torch.float32  # [B, S, N], what ring attention merges
    torch.testing.assert_close(lse, ref_lse, atol=2e-3, rtol=2e-3)
    assert simulated_npu.calls(FIA_V2)[0]["return_softmax_lse"] is True


@pytest.mark.parametrize(
    "kw, reason",
    [
        (dict(dropout_p=0.1), "dropout_p=0.1"),
        (dict(is_causal=True), "is_causal"),
        (dict(attn_mask=torch.zeros(3, 1, 32, 24, dtype=torch.bool)), "does not broadcast"),
        (dict(attn_mask=torch.ones(24, dtype=torch.bool)), "attn_mask (24,) of 1 dim(s)"),
        (
            dict(attn_mask=torch.zeros(32, 24, dtype=torch.float16)),
            "attn_mask dtype torch.float16 for query torch.bfloat16",
        ),
    ],
)
def test_fia_unsupported_reasons(simulated_npu, kw, reason):
    from ascend_kernels.npu.attention import fia_unsupported

    q, k, v = _qkv()
    assert reason in fia_unsupported(q, k, v, **kw)
    assert "gradients" in fia_unsupported(q.requires_grad_(), k, v)
    assert fia_unsupported(q.detach(), k, v) is None


@pytest.mark.parametrize(
    "shape, reason",
    [
        (dict(n=128, d=512), "N*D = 128*512 = 65536"),  # the wheel's doc: BSND needs N*D < 65535
        (dict(n=127, d=512), None),  # 65024
        (dict(d=12), "multiple of 16"),  # the doc: float16/bfloat16 need D 16-aligned
        (dict(d=528), "D <= 512"),
    ],
)
def test_fia_limits_as_the_wheel_documents_them(simulated_npu, shape, reason):
    from ascend_kernels.npu.attention import fia_unsupported

    q, k, v = _qkv(b=1, sq=4, skv=4, **shape)
    got = fia_unsupported(q, k, v)
    assert got is None if reason is None else reason in got
    if reason is None:  # what we pass, the stand-in (the doc's limits) takes
        _close(_fia(q, k, v), _sdpa(q, k, v)[0], torch.bfloat16)


@pytest.mark.parametrize("soc, takes", [(221, True), (250, True), (102, False), (260, False), (241, False)])
def test_fia_only_on_atlas_a2_a3(monkeypatch, soc, takes):
    """The doc lists Atlas A2/A3 only: any other SoC falls back (fp16 too), with the SoC named."""
    from ascend_kernels.npu.attention import fia_unsupported
    from tests.simulated_npu import simulated_npu_host

    with simulated_npu_host(monkeypatch, soc=soc):
        q, k, v = _qkv(dtype=torch.float16)
        reason = fia_unsupported(q, k, v)
        assert (reason is None) == takes and (takes or f"SoC {SOC_NAMES.get(soc, f'soc{soc}')}" in reason)


def test_fia_lse_out_of_contract_is_an_error(simulated_npu):
    q, k, v = _qkv(dtype=torch.float32)
    with pytest.raises(ValueError, match="return_lse=True needs FIA's log-sum-exp.*float32"):
        _fia(q, k, v, attention_kwargs={"return_lse": True})


def test_fia_missing_from_torch_npu_falls_back(monkeypatch):
    from tests.simulated_npu import simulated_npu_host

    with simulated_npu_host(monkeypatch, fia=()) as host:
        q, k, v = _qkv()
        _close(_fia(q, k, v), _sdpa(q, k, v)[0], torch.bfloat16)
        assert [n for n, _ in host.torch_npu.calls] == ["npu_fusion_attention"]
        assert "torch_npu has no npu_fused_infer_attention_score -> npu_fusion_attention" in fallbacks()


@pytest.mark.parametrize("masked", [False, True], ids=["no_mask", "dead_row_mask"])
def test_fia_compiles_into_one_graph_with_the_op(simulated_npu, monkeypatch, masked):
    """With a mask, SDPA's value for fully masked rows is asked while tracing and is a constant of the graph."""
    from ascend_kernels.npu import attention

    q, k, v = _qkv()
    m = None
    if masked:
        m = MASKS["bool_full"](2, 32, 24)
        m[..., 0] = True
        m[0, :, 3] = False
        monkeypatch.setattr(attention, "_DEAD_ROW", {})  # not asked yet: the trace asks
    graphs = []

    def backend(gm, inputs):
        graphs.append(gm)
        return gm

    torch._dynamo.reset()
    fn = torch.compile(lambda q, k, v, m: _fia(q, k, v, attn_mask=m) * 2, backend=backend, fullgraph=True)
    _close(fn(q, k, v, m), _sdpa(q, k, v, m)[0] * 2, torch.bfloat16)
    (gm,) = graphs
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert any(FIA_V2 in t for t in targets) and not any("fusion_attention" in t for t in targets)
    torch._dynamo.reset()


# -- config -----------------------------------------------------------------------------------------


def test_fia_config_value_round_trips(tmp_path):
    cfg = AscendConfig(attention="npu_fia")
    assert AscendConfig.from_pretrained(cfg.save_pretrained(tmp_path)) == cfg
    assert AscendConfig.from_dict(cfg.to_dict()).attention == "npu_fia"
    with pytest.raises(ValueError, match=r"attention='npu_fai'.*'npu_fia'.*Did you mean 'npu_fia'"):
        AscendConfig(attention="npu_fai")


@pytest.mark.parametrize(
    "attention, capture, ring, platform, expected",
    [
        ("auto", None, False, "npu", "_native_npu"),
        ("auto", None, False, "npu", "native"),  # a float32 model: diffusers declares _native_npu bf16/fp16 only
        ("auto", "graph_only", False, "npu", "native"),  # float32: every FIA call would fall back to SDPA
        ("auto", "graph_with_compile", False, "npu", "npu_fia"),
        ("auto", "graph_only", False, "npu", "npu_fia"),
        ("auto", None, True, "npu", "npu_fia"),
        ("auto", "graph_with_compile", True, "cuda", None),
        ("auto", None, True, "cpu", None),
        ("npu_fia", None, False, "cpu", "npu_fia"),
        ("_native_npu", "graph_with_compile", False, "npu", "_native_npu"),
        (None, "graph_with_compile", False, "npu", None),
    ],
)
def test_fia_resolved_attention(attention, capture, ring, platform, expected):
    cfg = AscendConfig(attention=attention, graph_capture=capture)
    dtype = torch.float32 if expected == "native" else torch.bfloat16
    assert cfg.resolved_attention(platform, ring=ring, dtype=dtype) == expected
    if expected == "_native_npu" and attention == "auto":  # an unknown dtype keeps the bf16/fp16 choice
        assert cfg.resolved_attention(platform, ring=ring) == expected


def test_fia_enable_sets_processors_and_disable_restores(simulated_npu):
    import diffusers_ascend
    from diffusers_ascend.tiny import tiny_flux_transformer

    model = tiny_flux_transformer(dtype=torch.bfloat16)
    before = [p._attention_backend for p in diffusers_ascend.attention.processors(model)]
    diffusers_ascend.enable_ascend_compile(model, attention="npu_fia", compile="none")
    procs = diffusers_ascend.attention.processors(model)
    assert procs and all(p._attention_backend is backend_for("npu_fia") for p in procs)
    loaded = pickle.loads(pickle.dumps(model))  # the backend (and the log's hooks) pickle by reference
    assert all(p._attention_backend is backend_for("npu_fia") for p in diffusers_ascend.attention.processors(loaded))
    assert len(model._forward_pre_hooks) == 1 and len(model._forward_hooks) == 1  # the model's own log
    diffusers_ascend.disable_ascend_compile(model)
    assert [p._attention_backend for p in diffusers_ascend.attention.processors(model)] == before
    assert not model._forward_pre_hooks and not model._forward_hooks


def test_fia_refused_at_enable_without_torch_npu():
    """No torch_npu (this machine): enable refuses npu_fia, as diffusers refuses _native_npu, and
    changes nothing (before, the first call failed with ModuleNotFoundError)."""
    import diffusers_ascend
    from diffusers_ascend.tiny import tiny_flux_transformer

    model = tiny_flux_transformer()
    before = [p._attention_backend for p in diffusers_ascend.attention.processors(model)]
    with pytest.raises(RuntimeError, match="attention='npu_fia' needs torch_npu, which is not installed.*'native'"):
        diffusers_ascend.enable_ascend_compile(model, attention="npu_fia", compile="none")
    assert [p._attention_backend for p in diffusers_ascend.attention.processors(model)] == before
    assert diffusers_ascend.ascend_report(model) is None


@pytest.mark.parametrize(
    "dtype, capture, expected",
    [
        (torch.bfloat16, None, "_native_npu"),
        (torch.float32, None, "native"),
        (torch.bfloat16, "graph_with_compile", "npu_fia"),
        (torch.float32, "graph_with_compile", "native"),  # every FIA call would fall back to SDPA
    ],
)
def test_fia_auto_on_simulated_npu(simulated_npu, monkeypatch, dtype, capture, expected):
    """attention="auto" picks a backend valid for the model's dtype: with diffusers' checks on
    (DIFFUSERS_ATTN_CHECKS=1), a float32 model on "_native_npu" raises at its first call."""
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    import diffusers_ascend
    from diffusers_ascend.tiny import flux_model_inputs, tiny_flux_transformer

    monkeypatch.setattr(_AttentionBackendRegistry, "_checks_enabled", True)
    model = tiny_flux_transformer(dtype=dtype)
    with torch.no_grad():
        ref = model(**flux_model_inputs(dtype=dtype))[0]
    if capture is None:
        diffusers_ascend.enable_ascend_compile(model, compile="none")
    else:
        diffusers_ascend.enable_ascend_compile(model, executor="eager", graph_capture=capture)
    assert {str(p._attention_backend.value) for p in diffusers_ascend.attention.processors(model)} == {expected}
    with torch.no_grad():
        out = model(**flux_model_inputs(dtype=dtype))[0]
    torch.testing.assert_close(out.float(), ref.float(), **TOLERANCES[dtype])
    diffusers_ascend.disable_ascend_compile(model)


def _fia_entries(model) -> list[str]:
    import diffusers_ascend

    return [
        f["reason"] for f in diffusers_ascend.ascend_report(model).fallbacks if f["module"] == "attention (npu_fia)"
    ]


@pytest.mark.parametrize("compile", ["none", "blocks", "model"])
def test_fia_report_tells_each_models_own_story(simulated_npu, compile):
    """Two models in one process, one float32 (every call falls back), one bfloat16 (every call on
    FIA): each report shows its own calls only (the log used to be the process's)."""
    import diffusers_ascend
    from diffusers_ascend.tiny import flux_model_inputs, tiny_flux_transformer

    kw = dict(attention="npu_fia", compile=compile, **({"executor": "eager"} if compile != "none" else {}))
    fp32 = diffusers_ascend.enable_ascend_compile(tiny_flux_transformer(), **kw)
    bf16 = diffusers_ascend.enable_ascend_compile(tiny_flux_transformer(dtype=torch.bfloat16), **kw)
    with torch.no_grad():
        for _ in range(2):
            fp32(**flux_model_inputs())
            bf16(**flux_model_inputs(dtype=torch.bfloat16))
    calls = 2 * 2  # 2 forwards x (1 double-stream + 1 single-stream block), one attention each
    assert _fia_entries(fp32) == [
        f"{calls} call(s) fell back: dtype torch.float32 (FIA takes float16/bfloat16) -> sdpa"
    ]
    assert _fia_entries(bf16) == []
    assert len(simulated_npu.calls("npu_fused_infer_attention_score_v2")) == calls
    # Counting a fallback (a graph break, outside the graph) recompiles nothing.
    graphs = len(diffusers_ascend.ascend_report(fp32).graphs)
    with torch.no_grad():
        fp32(**flux_model_inputs())
    assert len(diffusers_ascend.ascend_report(fp32).graphs) == graphs
    assert _fia_entries(fp32) == [
        f"{calls + 2} call(s) fell back: dtype torch.float32 (FIA takes float16/bfloat16) -> sdpa"
    ]
    diffusers_ascend.disable_ascend_compile(fp32)
    diffusers_ascend.enable_ascend_compile(fp32, **kw)
    assert _fia_entries(fp32) == []  # a new enable reports its own calls
    with torch.no_grad():
        fp32(**flux_model_inputs())
    assert _fia_entries(fp32) == ["2 call(s) fell back: dtype torch.float32 (FIA takes float16/bfloat16) -> sdpa"]
    for m in (fp32, bf16):
        diffusers_ascend.disable_ascend_compile(m)


def test_fia_env_shows_the_decision_and_contract(simulated_npu):
    from diffusers_ascend.cli import env_info

    info = env_info()
    assert info["attention_backend"] == "_native_npu" and info["attention_with_capture"] == "npu_fia"
    assert info["npu_fia"].startswith(
        f"torch_npu.{FIA_V2} (SoC Ascend910B2); calls outside Atlas A2/A3; float16/bfloat16"
    )


def test_fia_report_per_model_of_a_pipeline(simulated_npu):
    """A two-stage Wan pipeline (transformer and transformer_2, float32: every call falls back):
    each model's report counts its own calls, the pipeline's report both."""
    import diffusers_ascend
    from diffusers_ascend.tiny import tiny_wan_pipeline, wan_pipeline_inputs

    pipe = tiny_wan_pipeline(two_stage=True)
    pipe.enable_ascend_compile(attention="npu_fia", compile="none")
    forwards = {}
    for name in ("transformer", "transformer_2"):
        model = getattr(pipe, name)
        model.register_forward_pre_hook(lambda m, a, name=name: forwards.__setitem__(name, forwards.get(name, 0) + 1))
    with torch.no_grad():
        pipe(**wan_pipeline_inputs())
    assert forwards["transformer"] >= 1 and forwards["transformer_2"] >= 1
    for name in ("transformer", "transformer_2"):
        model = getattr(pipe, name)
        calls = forwards[name] * len(diffusers_ascend.attention.processors(model))  # one call per processor
        assert _fia_entries(model) == [
            f"{calls} call(s) fell back: dtype torch.float32 (FIA takes float16/bfloat16) -> sdpa"
        ]
    assert len(_fia_entries(pipe)) == 2
