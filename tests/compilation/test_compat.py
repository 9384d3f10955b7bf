"""The torch compatibility layer: supported range, feature detection, and a broken engine failing loudly.

Part of the engine tests that CI runs on every torch release of the matrix (noxfile.py): on each,
the pattern matcher must register and match every fusion's own forms.
"""

from __future__ import annotations

import pathlib
import re
import warnings

import pytest
import torch

import diffusers_ascend
from diffusers_ascend import AscendBackend
from diffusers_ascend.compilation import _compat
from diffusers_ascend.compilation._compat import TorchCompatError
from diffusers_ascend.compilation.backend import root_cause
from diffusers_ascend.compilation.passes import FUSION_PASSES, base, get_pass_class
from diffusers_ascend.platform import override_platform
from diffusers_ascend.tiny import flux_block_inputs, flux_model_inputs, tiny_flux_blocks, tiny_flux_transformer

from .conftest import EXPECTED_BLOCK_COUNTS

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_error_is_public():
    assert diffusers_ascend.TorchCompatError is TorchCompatError and issubclass(TorchCompatError, RuntimeError)


def test_floor_is_stated_once_pyproject_agrees():
    spec = re.search(r'"torch>=([\d.]+)"', (REPO / "pyproject.toml").read_text()).group(1)
    assert _compat.torch_version(spec) == _compat.TORCH_FLOOR


@pytest.mark.parametrize(
    "version, status",
    [
        ("2.5.1", "too old"),
        ("2.6.0", "supported"),
        ("2.8.0+cu128", "supported"),
        ("2.14.1", "supported"),
        ("2.15.0", "supported"),
        ("2.16.0", "newer than verified"),
        ("3.0.0a0+git", "newer than verified"),
    ],
)
def test_support_status(version, status):
    got, sentence = _compat.support_status(version)
    assert got == status and version in sentence and "2.6 to 2.15.x" in sentence


def test_running_torch_is_in_the_verified_range():
    # CI runs this file on every release of its matrix: each must be inside the stated range.
    assert _compat.support_status()[0] == "supported", torch.__version__


@pytest.mark.parametrize("fusion", list(FUSION_PASSES))
def test_every_pass_registers_and_matches_its_own_forms(fusion):
    get_pass_class(fusion).verify()  # raises TorchCompatError where the matcher misbehaves


def test_a_given_search_pattern_is_matched_as_given():
    # The hand-built `aten._fused_rms_norm` form and the generic `retrace = False` forms are
    # registered with their pattern given; 2.15's matcher re-traces the search function instead
    # (here `sub`, so the given `atan2` would never match): the shim keeps the pattern as given.
    import torch._inductor.pattern_matcher as pm

    aten = torch.ops.aten
    given = pm.CallFunction(aten.atan2.default, pm.KeywordArg("a"), pm.KeywordArg("b"))
    seen = []

    def check(match):
        seen.append(sorted(match.kwargs))
        return True

    matcher = _compat.pattern_matcher_pass("test_given_pattern")
    example = [torch.randn(2), torch.randn(2)]
    _compat.register_replacement(
        lambda a, b: a - b,
        lambda a, b: a * b,
        example,
        base.trace_functional,
        matcher,
        get_decomp_fn=base.no_decompositions,
        extra_check=check,
        search_fn_pattern=given,
        skip_duplicates=True,
    )
    graph = _compat.one_op_graph(aten.atan2.default, example)
    assert matcher.apply(graph) == 1 and seen == [["a", "b"]]
    targets = [n.target for n in graph.nodes if n.op == "call_function"]
    assert targets == [aten.mul.Tensor]
    (out,) = [n for n in graph.nodes if n.op == "output"]
    assert out.args[0][0].meta["val"].shape == (2,)  # the replacement carries fake tensor metadata


def test_recompile_limit_shim_reads_and_writes_dynamo_config():
    before = _compat.dynamo_recompile_limit()
    try:
        _compat.set_dynamo_recompile_limit(before + 3)
        name = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
        assert getattr(torch._dynamo.config, name) == before + 3
    finally:
        _compat.set_dynamo_recompile_limit(before)


@pytest.fixture
def fresh_registration():
    """Forget every registered pattern before and after the test (the next use registers again),
    so a test that breaks registration leaves nothing behind."""

    def clear():
        base._registered_impl.cache_clear()
        base._verified_impl.cache_clear()

    clear()
    yield
    clear()


def _state(model):
    return {
        "classes": [type(m) for m in model.modules()],
        "compiled": [m._compiled_call_impl for m in model.modules()],
        "config": dict(model.config),
        "enabled": hasattr(model, "_ascend_state"),
        "recompile_limit": _compat.dynamo_recompile_limit(),
    }


def test_broken_pattern_matcher_api_raises_at_enable_and_changes_nothing(monkeypatch, fresh_registration):
    # What torch 2.11 did to the first version: register_replacement() rejected a keyword.
    def broken(*args, **kwargs):
        raise TypeError("register_replacement() got an unexpected keyword argument 'get_decomp_fn'")

    monkeypatch.setattr(_compat, "register_replacement", broken)
    from diffusers_ascend.fusions import PASS_ORDER, default_fusions

    first = next(f for f in PASS_ORDER if f in default_fusions())  # "all"'s first pass registers first
    model = tiny_flux_transformer()
    before = _state(model)
    with pytest.raises(
        TorchCompatError,
        match=rf"(?s)'{first}' fusion pass cannot work on torch "
        + re.escape(torch.__version__)
        + r".*register.*get_decomp_fn.*Supported torch: 2\.6 to 2\.15",
    ):
        diffusers_ascend.enable_ascend_compile(model, fusions="all", executor="eager")
    assert _state(model) == before


def test_pattern_matcher_that_silently_matches_nothing_raises(monkeypatch, fresh_registration):
    # A release whose matcher accepts the registration but never fires: 0 matches must not pass.
    monkeypatch.setattr(_compat, "register_replacement", lambda *a, **k: None)
    with pytest.raises(TorchCompatError, match=r"pattern AdaLNPattern\[.*\] replaced its own form 0 times"):
        AscendBackend(fusions=["adaln"], executor="eager")


def test_broken_engine_error_is_not_a_block_fallback(monkeypatch):
    # An engine break discovered inside a compile propagates even with on_error="fallback".
    model = tiny_flux_transformer()
    diffusers_ascend.enable_ascend_compile(model, fusions=["mul_add"], executor="eager", on_error="fallback")
    backend = model._ascend_state.backend

    def broken(graph, after_step=None):
        raise TorchCompatError("diffusers-ascend: simulated missing API")

    monkeypatch.setattr(backend, "manager", broken)
    torch.compiler.reset()
    with pytest.raises(TorchCompatError, match="simulated missing API"), torch.no_grad():
        model(**flux_model_inputs(4, 4))
    diffusers_ascend.disable_ascend_compile(model)


def test_fallback_reason_names_the_inner_cause(monkeypatch):
    model = tiny_flux_transformer()
    with torch.no_grad():
        ref = model(**flux_model_inputs(4, 4))[0]
    diffusers_ascend.enable_ascend_compile(model, fusions=["mul_add"], executor="eager", on_error="fallback")

    def exploding(self, gm, example_inputs, keep=None):
        raise ValueError("executor exploded on this block\nsecond line")

    monkeypatch.setattr(AscendBackend, "_execute", exploding)
    torch.compiler.reset()
    with (
        pytest.warns(UserWarning, match=r"running eager \(ValueError: executor exploded on this block\)"),
        torch.no_grad(),
    ):
        out = model(**flux_model_inputs(4, 4))[0]
    torch.testing.assert_close(out, ref)
    reasons = {f["reason"] for f in diffusers_ascend.ascend_report(model).fallbacks}
    assert reasons == {"ValueError: executor exploded on this block"}
    diffusers_ascend.disable_ascend_compile(model)


def test_too_old_torch_is_refused_with_the_range(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.4.1")
    with pytest.raises(
        TorchCompatError, match=r"torch 2\.4\.1 is older than the supported range \(torch 2\.6 to 2\.15\.x\)"
    ):
        AscendBackend(fusions=["rms_norm"], executor="eager")


def test_newer_untested_torch_warns_once(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.99.0")
    _compat._warn_untested.cache_clear()
    try:
        with pytest.warns(UserWarning, match=r"torch 2\.99\.0 is newer than the newest release verified"):
            _compat.check_engine(fusions=False)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            _compat.check_engine(fusions=False)  # once, not per backend
    finally:
        _compat._warn_untested.cache_clear()


def test_private_torch_apis_only_in_the_compat_module():
    private = re.compile(
        r"^\s*(from|import)\s+torch\._(inductor|dynamo|functorch|subclasses|guards)\b"
        r"|torch\._(inductor|dynamo|functorch|subclasses|guards)\.\w+\(",
        re.M,
    )
    offenders = []
    for path in (REPO / "diffusers_ascend").rglob("*.py"):
        if path.name == "_compat.py":
            continue
        for line in path.read_text().splitlines():
            if private.search(line) and not line.lstrip().startswith("#"):
                offenders.append(f"{path.relative_to(REPO)}: {line.strip()}")
    assert not offenders, "private torch APIs outside compilation/_compat.py:\n" + "\n".join(offenders)


def test_fused_blocks_on_this_torch_match_the_findings_table():
    # The FINDINGS counts, on whatever release runs this file (every release of the CI matrix).
    double, single = tiny_flux_blocks()
    backend = AscendBackend(fusions="all", executor="eager")
    with override_platform("cpu"), torch.no_grad():
        torch.compile(double, backend=backend)(**flux_block_inputs())
    assert backend.report.matches == EXPECTED_BLOCK_COUNTS["flux_double"]


def test_env_reports_the_range_and_where_this_torch_stands(monkeypatch, capsys):
    from diffusers_ascend import cli, platform

    info = cli.env_info()
    assert info["torch_supported_range"] == "2.6 to 2.15.x" and info["torch_status"] == "supported"
    # A newer torch, with a torch_npu built for another release (stand-in facts, no torch_npu here).
    monkeypatch.setattr(torch, "__version__", "2.99.0")
    monkeypatch.setattr(cli, "_version", lambda dist: "2.8.0.post2" if dist == "torch_npu" else "1.0")
    real = platform.platform_info
    monkeypatch.setattr(platform, "platform_info", lambda: {**real(), "torch_npu_installed": True})
    assert cli.main(["env"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"torch_status\s+newer than verified", out)
    assert re.search(r"torch_npu_matches_torch\s+False", out)
    assert "warning: torch 2.99.0 is newer than the newest release verified (torch 2.6 to 2.15.x)" in out
    assert "warning: torch_npu 2.8.0.post2 was built for another torch than 2.99.0" in out


# -- a failing self-check says why, and blames torch only when torch is at fault ------------------
class SiluTimesTwo(base.FusionPattern):
    """A test pattern: ``silu(x) * 2`` -> ``sigmoid(x) * x * 2``; `fault` breaks it one way."""

    FORMS = ("ok", "raises", "raises_in_torch", "refuses", "wrong_dtype", "matches_twice")

    def example_inputs(self):
        return [torch.randn(2, 8)]

    def search(self, x):
        if self.form == "raises":
            raise ValueError("a bug in the search function")
        if self.form == "raises_in_torch":
            torch.nn.functional.layer_norm(x, (5,))  # a wrong call: torch raises inside its own code
        return torch.nn.functional.silu(x) * 2

    def replace(self, x):
        out = torch.sigmoid(x) * x * 2
        return out.half() if self.form == "wrong_dtype" else out

    def check(self, match):
        return self.form != "refuses"

    def probe_graph(self):
        if self.form != "matches_twice":
            return super().probe_graph()
        # a hand-written form holding two sites: the self-check must count 2, not pass
        gm = _compat.probe_trace(lambda x: self.search(x) + self.search(x + 1), example_inputs_of_pattern(self))
        return gm.graph


def example_inputs_of_pattern(pattern):
    return base.example_inputs_of(pattern)


def _pass_of(form):
    # A new class per test: registration and the self-check are cached per class.
    return type(
        f"SiluTimesTwoPass_{form}",
        (base.FusionPass,),
        {"fusion": f"silu_x2_{form}", "patterns": classmethod(lambda cls: [SiluTimesTwo(form)])},
    )


def test_a_sound_pattern_passes_its_self_check():
    cls = _pass_of("ok")
    cls.verify()
    graph = SiluTimesTwo("ok").probe_graph()
    assert cls().__call__(graph) == 1


@pytest.mark.parametrize(
    "form, detail",
    [
        (
            "raises",
            r"failed: registering it with Inductor's pattern matcher raised ValueError: a bug in the search "
            r"function \(at .*test_compat\.py:\d+ in search\)",
        ),
        (
            "raises_in_torch",
            r"failed: registering it with Inductor's pattern matcher raised RuntimeError: .*\(inside "
            r"torch, called at .*test_compat\.py:\d+ in search: check that call against torch's API\)",
        ),
        (
            "refuses",
            r"replaced its own form 0 times instead of once \(expected 1, found 0\): the matcher found its "
            r"structure and the pattern refused it: SiluTimesTwo\[refuses,float32\]: SiluTimesTwo\.check\(\) refused it",
        ),
        (
            "wrong_dtype",
            r"replaced its own form 0 times instead of once \(expected 1, found 0\): .*: the replacement "
            r"returns \['float16\(2, 8\)'\] where the matched code returns \['float32\(2, 8\)'\]",
        ),
        ("matches_twice", r"replaced its own form 2 times instead of once \(expected 1, found 2\)"),
    ],
)
def test_a_pattern_at_fault_is_named_and_torch_is_not_blamed(form, detail):
    with pytest.raises(base.FusionSelfCheckError) as info:
        _pass_of(form).verify()
    message = str(info.value)
    assert not isinstance(info.value, TorchCompatError)
    assert re.search(
        rf"the 'silu_x2_{form}' fusion failed its self-check: pattern SiluTimesTwo\[{form},float32\] "
        rf"\(form '{form}'\) ",
        message,
    ), message
    assert re.search(detail, message), message
    assert "is at fault, not torch " + torch.__version__ in message


def test_a_torch_that_traces_the_pattern_otherwise_is_blamed_with_the_ops_that_differ(monkeypatch):
    # A release whose matcher traces the search function with another decomposition than the
    # graphs it must match (silu decomposed): the pattern never fires, through no fault of its own.
    from torch._decomp import get_decompositions

    # Through the trace function itself: releases before 2.13 call it without `get_decomp_fn`, so
    # patching the default table would not reach them.
    real = base.trace_functional
    silu_decomposed = get_decompositions([torch.ops.aten.silu])
    monkeypatch.setattr(
        base, "trace_functional", lambda fn, args, **kw: real(fn, args, get_decomp_fn=lambda: silu_decomposed)
    )
    with pytest.raises(TorchCompatError) as info:
        _pass_of("ok").verify()
    message = str(info.value)
    assert "'silu_x2_ok' fusion pass cannot work on torch " + torch.__version__ in message
    assert re.search(
        r"pattern SiluTimesTwo\[ok,float32\] replaced its own form 0 times instead of once \(form 'ok', "
        r"expected 1, found 0: torch traces the search function for its pattern matcher otherwise than "
        r"aot_autograd presents the form; the pattern's trace has \[.*aten\.sigmoid\.default.*\] that the "
        r"form's graph lacks, and the form's graph has \['aten\.silu\.default'\] that the trace lacks\)",
        message,
    ), message


def test_a_registration_that_registers_nothing_is_torchs(monkeypatch):
    monkeypatch.setattr(_compat, "register_replacement", lambda *a, **k: None)
    with pytest.raises(
        TorchCompatError,
        match=r"pattern SiluTimesTwo\[ok,float32\] replaced its own form 0 times "
        r"instead of once \(form 'ok': register_replacement returned and left the pattern matcher "
        r"without a pattern\)",
    ):
        _pass_of("ok").verify()


def test_a_pattern_error_is_never_a_graph_fallback(monkeypatch):
    backend = AscendBackend(fusions=["mul_add"], executor="eager", on_error="fallback")

    def broken(graph, after_step=None):
        raise base.FusionSelfCheckError("diffusers-ascend: simulated pattern bug")

    monkeypatch.setattr(backend, "manager", broken)
    torch.compiler.reset()
    with pytest.raises(Exception) as info, torch.no_grad():
        torch.compile(lambda a, b, c: a * b + c, backend=backend)(*torch.randn(3, 4))
    assert isinstance(root_cause(info.value), base.FusionSelfCheckError) and backend.report.fallbacks == []
