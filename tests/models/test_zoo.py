"""The model zoo: every model class of the installed diffusers that declares `_repeated_blocks`,
built tiny (configs in `zoo_table.TINY`; parameters a fresh model sets to zero, such as
adaLN-Zero gates and layer scales, drawn at random so every block contributes), enabled with ``fusions="all"`` under ``compile="blocks"``
(fp32, eager executor) and checked for: no error and no fallback, numerics equal to eager within
fp32 tolerance, no recompilation on a repeated call, a clean disable (stock output bit for bit,
stock classes back), a save/load round trip that re-enables the same config, and the exact
coverage recorded in the table (pattern matches, module swaps, leftover ops per fusion).

``DIFFUSERS_ASCEND_ZOO_RECORD=1`` prints the coverage measured instead of asserting it (to update
the table after a deliberate change); ``DIFFUSERS_ASCEND_ZOO_OUT=<dir>`` also writes one JSON
coverage file per model there.
"""

from __future__ import annotations

import glob
import inspect
import json
import os
import re

import pytest
import torch

from ascend_kernels.testing import assert_close

from .zoo_table import COVERAGE, LEFT_OPS, MIN_TORCH, NOT_COVERED, OUTSIDE_ZOO, SWIGLU_SITES, TINY, markdown_table

RECORD = os.environ.get("DIFFUSERS_ASCEND_ZOO_RECORD") == "1"


def discover() -> list[str]:
    """Names of the diffusers model classes (ModelMixin) that declare `_repeated_blocks`."""
    import diffusers
    from diffusers import ModelMixin

    names = []
    for name in dir(diffusers):
        try:
            obj = getattr(diffusers, name)
        except Exception:  # optional backends missing: not a model of this install
            continue
        if inspect.isclass(obj) and issubclass(obj, ModelMixin) and getattr(obj, "_repeated_blocks", None):
            names.append(name)
    return sorted(names)


def _tensors(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _tensors(o)]
    return []


def _assert_same(actual, expected, exact=False, dtype=torch.float32):
    a, e = _tensors(actual), _tensors(expected)
    assert len(a) == len(e) and a, "outputs differ in structure"
    for x, y in zip(a, e):
        if exact:
            torch.testing.assert_close(x, y, rtol=0, atol=0)
        else:
            assert_close(x, y, dtype=dtype)


def _left_ops(log_dir: str) -> dict[str, int]:
    """Leftover ops (`LEFT_OPS`) in the last logged stage of every compiled graph."""
    last: dict[str, str] = {}
    for path in sorted(glob.glob(os.path.join(log_dir, "*.py"))):
        graph = re.sub(r"\.\d\d\.[a-z0-9_]+\.py$", "", os.path.basename(path))
        last[graph] = path  # sorted: the highest step of each graph wins
    counts: dict[str, int] = {}
    for path in last.values():
        src = open(path).read()
        for fusion, pattern in LEFT_OPS.items():
            n = len(re.findall(pattern, src))
            if n:
                counts[fusion] = counts.get(fusion, 0) + n
    return counts


def _build(name: str, **init_overrides):
    import diffusers

    tiny = TINY[name] if name in TINY else OUTSIDE_ZOO[name]
    torch.manual_seed(0)
    model = getattr(diffusers, name)(**{**tiny.init, **init_overrides}).eval()
    # Parameters a fresh model initialises to zero (adaLN-Zero gates, layer scales, output
    # projections) would let a block add nothing to the output, and "equal to eager" would then
    # hold whatever the fused block computed: draw them instead.
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.numel() and not p.any():
                p.copy_(0.1 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return model, tiny.inputs(torch.Generator().manual_seed(0))


def test_every_discovered_model_is_in_the_table():
    found = set(discover())
    assert found, "no diffusers model with _repeated_blocks found"
    assert not set(TINY) & set(NOT_COVERED)
    missing = sorted(found - set(TINY) - set(NOT_COVERED))
    assert not missing, (
        f"models with _repeated_blocks in this diffusers but not in tests/models/zoo_table.py: {missing}"
    )
    stale = sorted((set(TINY) | set(NOT_COVERED)) - found)
    assert not stale, f"zoo_table.py names models this diffusers does not have: {stale}"


def test_support_matrix_shows_the_table():
    path = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "support-matrix.md")
    assert markdown_table() in open(path).read(), "docs/support-matrix.md model table is stale: paste markdown_table()"


@pytest.mark.parametrize("name", sorted(TINY))
def test_zoo_model(name, tmp_path):
    from diffusers_ascend.compilation._compat import torch_version

    if name in MIN_TORCH and torch_version() < MIN_TORCH[name][0]:
        pytest.skip(MIN_TORCH[name][1])
    _check_model(name, tmp_path)


def test_zoo_fails_when_a_model_loses_a_fusion(tmp_path):
    # Flux without the adaLN fusion: its 5 adaLN sites stay unfused, which the zoo reports
    with pytest.raises(AssertionError, match="coverage changed"):
        _check_model("FluxTransformer2DModel", tmp_path, fusions=["rms_norm", "rope", "gelu_tanh", "mul_add"])


def test_zoo_counts_swiglu_sites_left(tmp_path):
    # Flux 2 without the swiglu fusion: its 3 SwiGLU sites (two FFNs of the double block, the
    # single block's fused MLP) are counted as left, and the coverage check fails on them
    from diffusers_ascend.fusions import default_fusions

    with pytest.raises(AssertionError, match="'left': {'swiglu': 3}"):
        _check_model("Flux2Transformer2DModel", tmp_path, fusions=[f for f in default_fusions() if f != "swiglu"])


def test_zoo_fails_when_a_model_diverges(tmp_path, monkeypatch):
    # a fused RMSNorm that is off by a little (1e-3) must not pass as "equal to eager"
    from diffusers_ascend.layers import FusedRMSNorm

    monkeypatch.setattr(FusedRMSNorm, "forward", lambda self, x: torch.nn.RMSNorm.forward(self, x) + 1e-3)
    with pytest.raises(AssertionError, match="tensors not close"):
        _check_model("FluxTransformer2DModel", tmp_path)


def _check_model(name, tmp_path, fusions="all", expected=None, **enable_kw):
    """Runs the zoo's checks on model `name`; `expected`: the coverage to assert (default: the CPU
    table's `COVERAGE`; the simulated Ascend host, tests/simhost, passes its own); `enable_kw`:
    further `enable_ascend_compile` arguments."""
    import diffusers_ascend  # noqa: F401  (adds enable_ascend_compile to ModelMixin)

    torch._dynamo.reset()
    model, inputs = _build(name)
    stock_classes = [type(m) for m in model.modules()]
    with torch.no_grad():
        ref = model(**inputs)

    log_dir = str(tmp_path / "graphs")
    model.enable_ascend_compile(fusions=fusions, executor="eager", compile="blocks", graph_log_dir=log_dir, **enable_kw)
    with torch.no_grad():
        out = model(**inputs)
    report = model.ascend_report()
    assert not report.fallbacks, report.fallbacks
    assert model._ascend_state.compiled, "no block compiled"
    _assert_same(out, ref)

    compiled = report.graphs_compiled
    with torch.no_grad():
        _assert_same(model(**inputs), ref)
    assert model.ascend_report().graphs_compiled == compiled, "a repeated call recompiled"

    coverage = dict(
        matches={k: v for k, v in report.matches.items() if v},
        swaps={k: v for k, v in report.swaps.items() if v},
        left=_left_ops(log_dir),
    )
    if report.upstream_fused:  # fused by diffusers itself (its NPU branches, where torch_npu is installed)
        coverage["upstream_fused"] = dict(report.upstream_fused)
    out_dir = os.environ.get("DIFFUSERS_ASCEND_ZOO_OUT")
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
            json.dump(coverage, f, indent=1, sort_keys=True)

    model.save_pretrained(tmp_path / "saved")
    loaded = type(model).from_pretrained(tmp_path / "saved")
    # Everything travels but the local graph_log_dir (never saved: issue 10).
    assert loaded._ascend_state.config == model._ascend_state.config.replace(graph_log_dir=None)
    with torch.no_grad():
        _assert_same(loaded(**inputs), ref)
    assert not loaded.ascend_report().fallbacks

    model.disable_ascend_compile()
    assert [type(m) for m in model.modules()] == stock_classes and not hasattr(model, "_ascend_state")
    with torch.no_grad():
        _assert_same(model(**inputs), ref, exact=True)

    if RECORD and fusions == "all":
        print(f"\nZOO {name}: {coverage}")
        return
    assert coverage == (COVERAGE.get(name) if expected is None else expected), (
        f"{name}: coverage changed (fused sites lost or gained); measured {coverage}"
    )


def test_ltx2_split_rope_is_fused():
    """LTX-2 with ``rope_type="split"`` (the zoo's table builds the default, interleaved): its 8
    rotary sites (video and audio self/cross attention) are fused as with interleaved, and the
    output equals eager."""
    import diffusers_ascend  # noqa: F401

    name = "LTX2VideoTransformer3DModel"
    torch._dynamo.reset()
    model, inputs = _build(name, rope_type="split")
    with torch.no_grad():
        ref = model(**inputs)
    model.enable_ascend_compile(fusions=["rope"], executor="eager", compile="blocks")
    with torch.no_grad():
        out = model(**inputs)
    report = model.ascend_report()
    assert report.matches["rope"] == COVERAGE[name]["matches"]["rope"] == 8 and not report.fallbacks
    _assert_same(out, ref)


def _cast(value, dtype):
    """`value` (a tensor, or a dict / list / tuple of them) with its floating tensors in `dtype`."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, dict):
        return {k: _cast(v, dtype) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype) for v in value)
    return value


def test_swiglu_sites_table_agrees_with_the_coverage():
    zoo_swiglu = {n for n, c in COVERAGE.items() if "swiglu" in c["matches"] or "swiglu" in c["left"]}
    assert set(SWIGLU_SITES) == zoo_swiglu | set(OUTSIDE_ZOO)
    for name in zoo_swiglu:
        assert SWIGLU_SITES[name]["float32"] == COVERAGE[name]["matches"].get("swiglu", 0), name


# The zoo's fp32 counts are measured by test_zoo_model (all fusions); models outside the zoo here.
_SWIGLU_CASES = sorted(
    (name, dtype)
    for name, counts in SWIGLU_SITES.items()
    for dtype, n in counts.items()
    if n is not None and (dtype != "float32" or name in OUTSIDE_ZOO)
)


@pytest.mark.parametrize("name,dtype", _SWIGLU_CASES)
def test_swiglu_sites_per_dtype(name, dtype):
    """The SwiGLU sites fused in `dtype` (exactly `SWIGLU_SITES`), output equal to eager within the
    dtype's tolerance. Lumina 2's upcast SiLU (``FP32SiLU``) matched in fp32 only, before its
    bf16 form was registered."""
    import diffusers_ascend  # noqa: F401

    torch._dynamo.reset()
    dt = getattr(torch, dtype)
    model, inputs = _build(name)
    model, inputs = model.to(dt), _cast(inputs, dt)
    with torch.no_grad():
        ref = model(**inputs)
    model.enable_ascend_compile(
        fusions=["swiglu"], executor="eager", compile="model" if name in OUTSIDE_ZOO else "blocks"
    )
    with torch.no_grad():
        out = model(**inputs)
    report = model.ascend_report()
    assert not report.fallbacks, report.fallbacks
    assert report.matches["swiglu"] == SWIGLU_SITES[name][dtype]
    _assert_same(out, ref, dtype=dt)
