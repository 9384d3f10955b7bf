"""Every ``npu_fia`` fallback computes SDPA's result, or raises SDPA's error: CONTRACT tests, not hardware.

A call FIA cannot take runs `ascend_kernels.npu.attention.fallback`. The matrix here is every
reason `fia_unsupported` gives x mask kind (none, bool, additive float, float 0/1) x ``is_causal``,
on the simulated Ascend host (tests/simulated_npu.py), whose stand-in ``npu_fusion_attention``
does what the wheel's doc says the real op does with masks (bool/uint8 only, True = masked out).
The reference is ``torch.nn.functional.scaled_dot_product_attention`` itself: run on the call's own
tensors it decides whether the call is valid; its fp32 result is the number to match. The same
matrix runs under Ulysses in tests/integration/test_npu_fia_parallel.py (`CASES` is shared).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from ascend_kernels.testing import TOLERANCES
from tests.kernels.npu_standins import WHEELS, fusion_attention_mask_shapes

MASK_KINDS = ("none", "bool", "additive", "float01")


@dataclasses.dataclass(frozen=True)
class Reason:
    """One reason FIA refuses a call: the call's shapes, arguments and host, and what must run."""

    reason: str  # a substring of `fia_unsupported`'s text
    shape: dict = dataclasses.field(default_factory=dict)  # `qkv` kwargs
    kw: dict = dataclasses.field(default_factory=dict)  # attention kwargs
    host: dict = dataclasses.field(default_factory=dict)  # `StandInTorchNpu` kwargs
    npu_fa: bool = True  # npu_fusion_attention is exact here for no mask, a bool mask or is_causal alone
    masks: tuple = MASK_KINDS  # the mask kinds for which FIA refuses the call for this reason
    mask_override: str | None = None  # a mask of its own (see `mask_for`)
    pse_cap: int | None = None  # MAX_PSE_BYTES for the call


REASONS = {
    "no_fia_op": Reason("torch_npu has no npu_fused_infer_attention_score", host=dict(fia=())),
    "soc_910a": Reason("Atlas A2/A3 only", dict(dtype=torch.float16), host=dict(soc=102), npu_fa=False),
    "fp32": Reason("dtype torch.float32", dict(dtype=torch.float32), npu_fa=False),
    "head_dim_24": Reason("multiple of 16", dict(d=24)),
    "head_dim_12": Reason("multiple of 16", dict(d=12)),
    "n_times_d_65536": Reason("N*D = 128*512 = 65536", dict(n=128, d=512, sq=4, skv=4, b=1)),
    "query_length_1": Reason("query length 1", dict(sq=1)),
    "pse_over_cap": Reason("as pse_shift would take", masks=("additive", "float01"), pse_cap=1024),
    "is_causal": Reason("is_causal", kw=dict(is_causal=True)),
    "gradients": Reason("needs gradients", dict(grad=True), npu_fa=False),
    "dropout": Reason("dropout_p=0.5", kw=dict(dropout_p=0.5), npu_fa=False),
    "gqa_ratio_66": Reason("GQA 66 query heads over 1", dict(n=66, nkv=1), kw=dict(enable_gqa=True)),
    "gqa_without_flag": Reason("without enable_gqa", dict(n=4, nkv=2)),  # SDPA refuses it
    "value_head_dim_32": Reason("differ", dict(dv=32), npu_fa=False),
    "per_head_bool_mask": Reason("per-head attn_mask", masks=("bool",), mask_override="per_head"),
    "int_mask": Reason("attn_mask dtype torch.int64", masks=("bool",), mask_override="int"),  # SDPA refuses it
    "mask_not_broadcast": Reason(
        "does not broadcast", masks=MASK_KINDS[1:], mask_override="batch_3"
    ),  # SDPA refuses it
}
CASES = [(r, m, c) for r, reason in REASONS.items() for m in MASK_KINDS for c in (False, True)]


def qkv(b=2, sq=16, skv=12, n=4, nkv=None, d=16, dv=None, dtype=torch.bfloat16, grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    nkv = nkv or n
    r = lambda *s: torch.randn(*s, generator=g).to(dtype)  # noqa: E731
    q, k, v = r(b, sq, n, d), r(b, skv, nkv, d), r(b, skv, nkv, dv or d)
    return q.requires_grad_(grad), k, v


def mask_for(kind: str, override: str | None, b: int, n: int, sq: int, skv: int, dtype) -> torch.Tensor | None:
    """A mask of ``kind`` broadcasting against ``[B, N, S, S_kv]``; key 0 is never masked out (fully
    masked rows: `MASK_SHAPES`)."""
    g = torch.Generator().manual_seed(7)
    if kind == "none":
        return None
    lead = 3 if override == "batch_3" else b
    heads = n if override == "per_head" else 1
    if override == "int":
        return (torch.rand(b, 1, 1, skv, generator=g) > 0.3).long()
    if kind == "bool":
        m = torch.rand(lead, heads, sq, skv, generator=g) > 0.3
        m[..., 0] = True
        return m
    if kind == "additive":
        m = torch.randn(lead, heads, sq, skv, generator=g)
        m[..., 1:] = m[..., 1:].masked_fill(torch.rand(lead, heads, sq, skv - 1, generator=g) > 0.7, float("-inf"))
        return m.to(dtype)
    return (torch.rand(lead, heads, sq, skv, generator=g) > 0.5).to(dtype)  # float 0/1: additive to SDPA


def call_args(name: str, mask_kind: str, causal: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    case = REASONS[name]
    q, k, v = qkv(**case.shape)
    b, sq, n, _ = q.shape
    kw = dict(case.kw)
    kw["is_causal"] = causal or kw.get("is_causal", False)
    override = case.mask_override if mask_kind in case.masks else None
    kw["attn_mask"] = mask_for(mask_kind, override, b, n, sq, k.shape[1], q.dtype)
    return q, k, v, kw


def sdpa_reference(q, k, v, attn_mask=None, is_causal=False, dropout_p=0.0, enable_gqa=False, seed=0):
    """(SDPA's fp32 result ``[B, S, N, D]``, None), or (None, the exception SDPA raises on the call's own tensors)."""
    bnsd = lambda t: t.detach().transpose(1, 2)  # noqa: E731
    kw = dict(attn_mask=attn_mask, is_causal=is_causal, dropout_p=dropout_p, enable_gqa=enable_gqa)
    try:
        with _seeded(seed):
            F.scaled_dot_product_attention(bnsd(q), bnsd(k), bnsd(v), **kw)
    except Exception as e:  # noqa: BLE001  (whatever SDPA refuses, the fallback must refuse)
        return None, e
    if attn_mask is not None and attn_mask.is_floating_point():
        kw["attn_mask"] = attn_mask.float()
    with _seeded(seed):
        out = F.scaled_dot_product_attention(bnsd(q).float(), bnsd(k).float(), bnsd(v).float(), **kw)
    return out.transpose(1, 2), None


@contextlib.contextmanager
def _seeded(seed: int):
    # Dropout draws from torch's global RNG (SDPA's own design): fork it, so the test leaves it as it was.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def expected_path(name: str, mask_kind: str, causal: bool) -> str:
    case = REASONS[name]
    takes_mask = mask_kind == "none" or (
        mask_kind == "bool" and case.mask_override in (None, "per_head")
    )  # bool, broadcasting
    causal = causal or case.kw.get("is_causal", False)
    return "npu_fusion_attention" if case.npu_fa and takes_mask and not (causal and mask_kind != "none") else "sdpa"


def run_case(name: str, mask_kind: str, causal: bool, attend) -> dict[str, Any]:
    """Runs one case through ``attend(q, k, v, **kw)``; returns the output, the error, the reference."""
    q, k, v, kw = call_args(name, mask_kind, causal)
    ref, ref_error = sdpa_reference(q, k, v, **kw)
    try:
        with _seeded(0):
            out, error = attend(q, k, v, **kw), None
    except Exception as e:  # noqa: BLE001
        out, error = None, e
    return dict(out=None if out is None else out.detach(), error=error, ref=ref, ref_error=ref_error, dtype=q.dtype)


def check(result: dict, name: str) -> None:
    if result["ref_error"] is not None:
        assert result["error"] is not None, (
            f"{name}: SDPA refuses this call ({result['ref_error']}) but npu_fia returned"
        )
        return
    assert result["error"] is None, f"{name}: {result['error']!r}"
    torch.testing.assert_close(result["out"].float(), result["ref"], **TOLERANCES[result["dtype"]])


@contextlib.contextmanager
def reason_host(monkeypatch, name: str):
    """The simulated host this reason needs (its SoC, its FIA ops, its pse_shift cap)."""
    from ascend_kernels.npu import attention
    from tests.simulated_npu import simulated_npu_host

    case = REASONS[name]
    if case.pse_cap is not None:
        monkeypatch.setattr(attention, "MAX_PSE_BYTES", case.pse_cap)
    with simulated_npu_host(monkeypatch, **case.host) as host:
        yield host


@pytest.mark.parametrize(
    "name, mask_kind, causal", CASES, ids=[f"{r}-{m}-{'causal' if c else 'full'}" for r, m, c in CASES]
)
def test_fallback_equals_sdpa(monkeypatch, name, mask_kind, causal):
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    from ascend_kernels.npu.attention import fia_unsupported
    from diffusers_ascend.attention import backend_for
    from diffusers_ascend.attention.npu_fia import fallbacks

    case = REASONS[name]
    with reason_host(monkeypatch, name) as host:
        q, k, v, kw = call_args(name, mask_kind, causal)
        reason = fia_unsupported(
            q,
            k,
            v,
            **{a: kw[a] for a in ("attn_mask", "is_causal")},
            dropout_p=kw.get("dropout_p", 0.0),
            enable_gqa=kw.get("enable_gqa", False),
        )
        before = fallbacks()
        result = run_case(
            name,
            mask_kind,
            causal,
            lambda q, k, v, **kw: dispatch_attention_fn(q, k, v, backend=backend_for("npu_fia"), **kw),
        )
        check(result, name)
        if mask_kind not in case.masks and not causal:  # FIA takes this one: the reason does not apply
            assert reason is None and host.calls("npu_fused_infer_attention_score_v2")
            return
        assert reason is not None and (case.reason in reason or causal and "is_causal" in reason), reason
        assert not host.calls("npu_fused_infer_attention_score_v2") and not host.calls(
            "npu_fused_infer_attention_score"
        )
        if result["error"] is not None:
            return
        path = expected_path(name, mask_kind, causal)
        assert bool(host.calls("npu_fusion_attention")) == (path == "npu_fusion_attention")
        grown = {r: c - before.get(r, 0) for r, c in fallbacks().items() if c > before.get(r, 0)}
        assert grown == {f"{reason} -> {path}": 1}


def test_fallback_bool_mask_reaches_npu_fusion_attention_inverted(simulated_npu):
    """The mask npu_fusion_attention gets is SDPA's bool mask inverted and broadcast to B1SS."""
    from ascend_kernels.npu.attention import fallback

    q, k, v = qkv(d=24)
    m = mask_for("bool", None, 2, 4, 16, 12, q.dtype)[:, :, :1]  # (B, 1, 1, S_kv): a key mask
    out, path = fallback(q, k, v, m)
    (call,) = simulated_npu.calls("npu_fusion_attention")
    assert path == "npu_fusion_attention" and call["atten_mask"].dtype == torch.bool
    assert torch.equal(call["atten_mask"], (~m).expand(2, 1, 16, 12))
    assert call["pre_tockens"] == call["next_tockens"] == 2147483647  # no band cut out of the scores


def test_fallback_without_torch_npu_is_sdpa(monkeypatch):
    """Called directly on a host without torch_npu (enable refuses it), npu_fia still computes SDPA."""
    import sys

    from diffusers.models.attention_dispatch import dispatch_attention_fn

    from ascend_kernels.npu import probe
    from diffusers_ascend.attention import backend_for
    from diffusers_ascend.attention.npu_fia import fallbacks

    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)  # no torch_npu on this machine
    probe.cache_clear()
    q, k, v, kw = call_args("fp32", "additive", False)
    out = dispatch_attention_fn(q, k, v, backend=backend_for("npu_fia"), **kw)
    torch.testing.assert_close(out, sdpa_reference(q, k, v, **kw)[0], **TOLERANCES[torch.float32])
    assert "torch_npu is not installed -> sdpa" in fallbacks()
    probe.cache_clear()


# -- masks: every shape SDPA broadcasts, fully masked rows, each path -------------------------------
# The reference is SDPA on the call's own tensors: its numbers (a fully masked row is what it returns
# there on the running torch: 0 on 2.13), or its error (a mask that does not broadcast; 1-D masks on
# torch 2.13, whose CPU kernel raises IndexError for them). The stand-ins take only the mask shapes
# their ops' docs list (npu_fusion_attention: BNSS/B1SS/11SS/SS, read from the wheel's doc; FIA:
# (S, S_kv), (B|1, S, S_kv), (B|1, 1, S, S_kv)) and return NaN in a fully masked row (undocumented).
MB, MN, MSQ, MSKV = 2, 4, 16, 12
MASK_SHAPES = {
    "1d_keys": (MSKV,),
    "2d": (MSQ, MSKV),
    "2d_keys": (1, MSKV),
    "2d_queries": (MSQ, 1),
    "3d_heads": (MN, MSQ, MSKV),
    "3d_heads_keys": (MN, 1, MSKV),
    "3d_shared": (1, MSQ, MSKV),
    "3d_batch": (MB, MSQ, MSKV),  # SDPA reads dim 0 as heads: 2 against 4, its error
    "4d_full": (MB, MN, MSQ, MSKV),
    "4d_heads": (1, MN, MSQ, MSKV),  # per head, shared by the batch
    "4d_heads_keys": (1, MN, 1, MSKV),
    "4d_batch": (MB, 1, MSQ, MSKV),
    "4d_batch_keys": (MB, 1, 1, MSKV),
    "4d_shared": (1, 1, MSQ, MSKV),
    "4d_batch_heads_keys": (MB, MN, 1, MSKV),
}
# path -> (query dtype, StandInTorchNpu kwargs): which op the host lets run first.
MASK_PATHS = {
    "fia-bf16": (torch.bfloat16, {}),
    "fia-fp16": (torch.float16, {}),
    "npu_fa-bf16": (torch.bfloat16, dict(fia=())),  # no FIA op: npu_fusion_attention where exact
    "npu_fa-fp16": (torch.float16, dict(fia=())),
    "sdpa-fp32": (torch.float32, {}),
    "sdpa-fp16-910a": (torch.float16, dict(soc=102)),  # neither op is documented there
}
MASK_CASES = [
    (path, shape, kind, dead)
    for path in MASK_PATHS
    for shape in MASK_SHAPES
    for kind in ("bool", "additive")
    for dead in (False, True)
]


@pytest.mark.parametrize("wheel", WHEELS)
def test_standin_reads_npu_fusion_attention_mask_shapes_from_the_wheel_doc(wheel):
    assert fusion_attention_mask_shapes(wheel) == ("BNSS", "B1SS", "11SS", "SS")


def shaped_mask(shape: tuple, kind: str, dead: bool, dtype) -> torch.Tensor:
    """A ``kind`` mask of ``shape`` that keeps key 0 of every row, unless ``dead``: then the last
    query row of the last batch/head entry the mask has (all of it, for a 1-D mask) keeps no key."""
    g = torch.Generator().manual_seed(11)
    keep = torch.rand(shape, generator=g) > 0.4
    keep[..., 0] = True
    if dead:
        keep[(-1,) * (len(shape) - 1)] = False
    if kind == "bool":
        return keep
    return torch.randn(shape, generator=g).masked_fill(~keep, float("-inf")).to(dtype)


def mask_path(path: str, shape: tuple, kind: str) -> str | None:
    """The op that must run: FIA for masks it documents (a bool mask without heads, any additive one
    as pse_shift), else npu_fusion_attention for a bool mask, else SDPA (None: SDPA's own error)."""
    full = (1,) * (4 - len(shape)) + shape
    if len(shape) < 2 or any(h not in (1, f) for h, f in zip(full, (MB, MN, MSQ, MSKV))):
        return None
    if path.startswith("fia") and not (kind == "bool" and full[1] != 1):
        return "npu_fused_infer_attention_score_v2"
    return "npu_fusion_attention" if path.startswith(("fia", "npu_fa")) and kind == "bool" else "sdpa"


def run_with_mask(q, k, v, mask) -> dict:
    """`run_case`'s result for ``npu_fia`` on ``(q, k, v)`` with ``attn_mask=mask``."""
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    from diffusers_ascend.attention import backend_for

    ref, ref_error = sdpa_reference(q, k, v, attn_mask=mask)
    try:
        out, error = dispatch_attention_fn(q, k, v, attn_mask=mask, backend=backend_for("npu_fia")), None
    except Exception as e:  # noqa: BLE001  (checked against SDPA's own answer)
        out, error = None, e
    return dict(out=out, error=error, ref=ref, ref_error=ref_error, dtype=q.dtype)


def run_mask_case(monkeypatch, path: str, shape_name: str, kind: str, dead: bool) -> tuple[dict, str | None, list]:
    """(result, the op that must run, the stand-in ops that ran) of one `MASK_CASES` case."""
    from tests.simulated_npu import simulated_npu_host

    dtype, host_kw = MASK_PATHS[path]
    q, k, v = qkv(b=MB, sq=MSQ, skv=MSKV, n=MN, dtype=dtype)
    mask = shaped_mask(MASK_SHAPES[shape_name], kind, dead, dtype)
    with simulated_npu_host(monkeypatch, **host_kw) as host:
        result = run_with_mask(q, k, v, mask)
    ops = [op for op, _ in host.torch_npu.calls]
    return result, mask_path(path, MASK_SHAPES[shape_name], kind), ops


@pytest.mark.parametrize(
    "path, shape_name, kind, dead",
    MASK_CASES,
    ids=[f"{p}-{s}-{k}{'-dead_row' if d else ''}" for p, s, k, d in MASK_CASES],
)
def test_mask_shapes_and_dead_rows_equal_sdpa_on_every_path(monkeypatch, path, shape_name, kind, dead):
    """Every mask SDPA takes gives SDPA's numbers on FIA, npu_fusion_attention and SDPA alike (fully
    masked rows included: the kernels' value there is replaced by SDPA's); every mask it refuses
    raises on each of them; and each op gets only the mask shapes its doc lists."""
    result, expected, ops = run_mask_case(monkeypatch, path, shape_name, kind, dead)
    assert (result["ref_error"] is None) == (expected is not None), result["ref_error"]
    check(result, f"{path} {shape_name} {kind}")
    assert ops == ([] if expected in (None, "sdpa") else [expected])
    if dead and expected is not None:
        assert not result["out"].isnan().any(), "a fully masked row came back NaN where SDPA returns numbers"


def _nan_in_dead_rows(sdpa):
    """SDPA as torch releases before the safe softmax computed it: NaN in a fully masked row."""

    def attend(q, k, v, attn_mask=None, **kw):
        out = sdpa(q, k, v, attn_mask=attn_mask, **kw)
        if attn_mask is None:
            return out
        full = attn_mask.reshape((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))
        dead = ~full.any(-1, keepdim=True) if attn_mask.dtype == torch.bool else full.isneginf().all(-1, keepdim=True)
        return out.masked_fill(dead, float("nan"))

    return attend


@pytest.mark.parametrize("path", ["fia-bf16", "npu_fa-fp16", "sdpa-fp32"])
def test_dead_rows_follow_the_running_torchs_sdpa(monkeypatch, path):
    """The value in a fully masked row is asked of the running torch's SDPA, not assumed: with an
    SDPA that returns NaN there, every path returns NaN there too (and numbers elsewhere)."""
    from ascend_kernels.npu import attention

    monkeypatch.setattr(F, "scaled_dot_product_attention", _nan_in_dead_rows(F.scaled_dot_product_attention))
    monkeypatch.setattr(attention, "_DEAD_ROW", {})  # asked again, of the SDPA in place now
    for kind in ("bool", "additive"):
        result, expected, _ = run_mask_case(monkeypatch, path, "4d_batch", kind, True)
        assert result["error"] is None and result["out"][-1, -1].isnan().all(), (path, kind)
        torch.testing.assert_close(result["out"].float(), result["ref"], equal_nan=True, **TOLERANCES[result["dtype"]])
        assert not result["out"][0].isnan().any()


@pytest.mark.parametrize(
    "mask_dtype, query_dtype, takes",
    [
        (torch.float32, torch.bfloat16, True),
        (torch.float16, torch.bfloat16, False),
        (torch.float64, torch.float16, False),
    ],
    ids=["fp32_mask-bf16_query", "fp16_mask-bf16_query", "fp64_mask-fp16_query"],
)
@pytest.mark.parametrize("path", ["fia", "npu_fa", "sdpa-910a"])
def test_float_mask_dtypes_as_sdpa_takes_them(monkeypatch, mask_dtype, query_dtype, takes, path):
    """SDPA takes a float mask in float32 or the query's dtype and refuses others; so does every path."""
    from tests.simulated_npu import simulated_npu_host

    host_kw = {"fia": {}, "npu_fa": dict(fia=()), "sdpa-910a": dict(soc=102)}[path]
    q, k, v = qkv(b=MB, sq=MSQ, skv=MSKV, n=MN, dtype=query_dtype)
    mask = shaped_mask((MB, 1, MSQ, MSKV), "additive", True, mask_dtype)
    with simulated_npu_host(monkeypatch, **host_kw) as host:
        result = run_with_mask(q, k, v, mask)
        fia_ran = bool(host.calls("npu_fused_infer_attention_score_v2"))
    assert (result["ref_error"] is None) == takes
    check(result, f"{path} mask {mask_dtype} query {query_dtype}")
    assert fia_ran == (takes and path == "fia")
