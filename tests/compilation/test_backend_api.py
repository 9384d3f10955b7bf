"""How the backend is used (compile a module, a class, a forward, module.compile), its errors at
construction, and what it must not do at import."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from diffusers_ascend.compilation import AscendBackend

from .conftest import EXPECTED_BLOCK_COUNTS


class Norm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.RMSNorm(8)

    def forward(self, x):
        return self.norm(x) + 1


def _check(backend, fn, x):
    with torch.no_grad():
        out = fn(x)
    torch.testing.assert_close(out, torch.nn.functional.rms_norm(x, (8,), torch.ones(8), None) + 1)
    assert backend.report.matches == {"rms_norm": 1}
    assert backend.report.graphs_compiled == 1


def test_compile_module():
    backend = AscendBackend(fusions=["rms_norm"], executor="eager")
    _check(backend, torch.compile(Norm(), backend=backend), torch.randn(2, 8))


def test_compile_module_class():
    backend = AscendBackend(fusions=["rms_norm"], executor="eager")

    @torch.compile(backend=backend)
    class CompiledNorm(Norm):
        pass

    _check(backend, CompiledNorm(), torch.randn(2, 8))


def test_compile_forward_method():
    backend = AscendBackend(fusions=["rms_norm"], executor="eager")

    class M(Norm):
        @torch.compile(backend=backend)
        def forward(self, x):
            return self.norm(x) + 1

    _check(backend, M(), torch.randn(2, 8))


def test_module_compile_in_place():
    backend = AscendBackend(fusions=["rms_norm"], executor="eager")
    m = Norm()
    m.compile(backend=backend)
    _check(backend, m, torch.randn(2, 8))
    assert list(m.state_dict()) == ["norm.weight"]  # no `_orig_mod.` prefix


def test_config_object_dict_and_overrides():
    from diffusers_ascend.config import AscendConfig

    cfg = AscendConfig(fusions=["rms_norm", "mul_add"], executor="eager")
    assert AscendBackend(cfg).fusions == ("rms_norm", "mul_add")
    assert AscendBackend({"fusions": ["rope"], "executor": "eager"}).fusions == ("rope",)
    backend = AscendBackend(cfg, fusions=["gelu_tanh"])
    assert backend.fusions == ("gelu_tanh",) and backend.executor == "eager"
    assert backend.report.matches == {"gelu_tanh": 0}
    assert "gelu_tanh" in repr(backend)


def test_graph_capture_on_cpu_is_a_clear_error():
    from diffusers_ascend.platform import override_platform

    with override_platform("cpu"), pytest.raises(ValueError, match=r"(?s)graph_capture.*'cpu'.*graph_capture=None"):
        AscendBackend(graph_capture="graph_only")


def test_import_is_light():
    code = (
        "import sys, diffusers_ascend.compilation as c; c.AscendBackend; c.FusionReport;"
        "print(any(m.startswith('torch._inductor') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_shared_backend_object_is_reused_not_rebuilt():
    backend = AscendBackend(fusions=["rms_norm"], executor="eager")
    a, b = torch.compile(Norm(), backend=backend), torch.compile(Norm(), backend=backend)
    with torch.no_grad():
        a(torch.randn(2, 8))
        b(torch.randn(2, 8))
    assert backend.report.graphs_compiled == 1  # same code, same backend: dynamo reuses the graph
    assert backend.manager is backend.manager


def _broken_manager(graph, after_step=None):
    raise RuntimeError("boom")


def test_failed_rewrite_falls_back_unfused(monkeypatch):
    backend = AscendBackend(fusions=["rms_norm"], executor="eager")
    monkeypatch.setattr(backend, "manager", _broken_manager)
    x = torch.randn(2, 8)
    with pytest.warns(UserWarning, match="runs unfused"), torch.no_grad():
        out = torch.compile(Norm(), backend=backend)(x)
    torch.testing.assert_close(out, torch.nn.functional.rms_norm(x, (8,), torch.ones(8), None) + 1)
    assert backend.report.matches == {"rms_norm": 0}
    assert backend.report.fallbacks[0]["reason"] == "rewrite failed: RuntimeError: boom"
    assert backend.report.ops_before == backend.report.ops_after > 0


def test_failed_rewrite_raises_when_asked(monkeypatch):
    backend = AscendBackend(fusions=["rms_norm"], executor="eager", on_error="raise")
    monkeypatch.setattr(backend, "manager", _broken_manager)
    with pytest.raises(Exception, match="boom"), torch.no_grad():
        torch.compile(Norm(), backend=backend)(torch.randn(2, 8))


def test_backend_alone_in_a_fresh_process_fuses():
    # Regression: nothing imported ascend_kernels on this path, every replacement failed on the
    # missing op and the failure read as "0 matches".
    code = (
        "import torch; from diffusers_ascend import AscendBackend;"
        "from diffusers_ascend.tiny import tiny_flux_blocks, flux_block_inputs;"
        "b = AscendBackend(fusions='all', executor='eager'); d, _ = tiny_flux_blocks();"
        "torch.compile(d, backend=b)(**flux_block_inputs()); print(sorted(b.report.matches.items()))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    expected = str(sorted(EXPECTED_BLOCK_COUNTS["flux_double"].items()))
    assert out.stdout.strip().splitlines()[-1] == expected, out.stderr[-2000:]
