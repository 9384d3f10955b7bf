"""An enabled model pickles and ``torch.save``s, like a ``torch.compile``d module.

What travels: the config, the fused layers (importable by name from `diffusers_ascend.layers`,
also in a fresh process that never enabled anything) and the attention backends; so the loaded
model computes as the enabled one and `disable_ascend_compile` restores the stock classes. As
for torch's in-place ``Module.compile()``, compilation does not travel: the loaded model's blocks
run uncompiled until enabled again.
"""

from __future__ import annotations

import io
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch

import diffusers_ascend  # noqa: F401  (adds the methods to diffusers models)
from ascend_kernels.testing import assert_close
from diffusers_ascend.tiny import flux_pipeline_inputs, tiny_flux_pipeline, tiny_wan_transformer

FAST = dict(fusions="all", executor="eager")


def _run(pipe):
    pipe.set_progress_bar_config(disable=True)
    with torch.no_grad():
        return pipe(**flux_pipeline_inputs()).images


def _fused(model) -> dict[str, int]:
    counts: dict[str, int] = {}
    for m in model.modules():
        for obj in (m, getattr(m, "processor", None)):
            if obj is not None and type(obj).__module__.startswith("diffusers_ascend."):
                counts[type(obj).__name__] = counts.get(type(obj).__name__, 0) + 1
    return counts


@pytest.mark.parametrize("how", ["pickle", "torch.save"])
def test_enabled_compiled_model_round_trips(how):
    torch._dynamo.reset()
    pipe = tiny_flux_pipeline()
    ref = _run(pipe)
    pipe.enable_ascend_compile(**FAST)
    accelerated = _run(pipe)  # compiled and called: the wrappers and the backend exist
    model = pipe.transformer
    if how == "pickle":
        loaded = pickle.loads(pickle.dumps(model))
    else:
        buf = io.BytesIO()
        torch.save(model, buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=False)
    assert (
        _fused(loaded)
        == _fused(model)
        == {"FusedRMSNorm": 6, "FusedGELU": 2, "FusedTorchGELU": 1, "FusedRopeFluxAttnProcessor": 2}
    )
    state = loaded._ascend_state
    assert state.config == model._ascend_state.config and state.backend is None and state.compiled == []
    assert all(m._compiled_call_impl is None for m in loaded.modules())  # as torch drops in-place compiles
    assert loaded.ascend_report().swaps == model.ascend_report().swaps
    pipe.transformer = loaded
    assert_close(_run(pipe), accelerated, dtype=torch.float32)
    loaded.disable_ascend_compile()
    assert _fused(loaded) == {} and "_ascend_config" not in loaded.config
    assert torch.equal(_run(pipe), ref)


def test_enabled_model_loads_in_a_fresh_process(tmp_path):
    model = tiny_wan_transformer()
    model.enable_ascend_compile(fusions="all", compile="none")
    torch.save(model, tmp_path / "m.pt")
    code = textwrap.dedent(
        f"""
        import torch
        m = torch.load({str(tmp_path / "m.pt")!r}, weights_only=False)
        print(sorted({{type(p).__name__ for mod in m.modules() for p in [getattr(mod, "processor", None)] if p is not None}}))
        m.disable_ascend_compile()
        print(sorted({{type(p).__name__ for mod in m.modules() for p in [getattr(mod, "processor", None)] if p is not None}}))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[:2] == ["['FusedRopeWanAttnProcessor']", "['WanAttnProcessor']"]


def test_fused_classes_are_module_attributes():
    from diffusers_ascend import layers

    for name in ("FusedGELU", "FastGELU", "FusedDiffusersRMSNorm"):
        cls = getattr(layers, name)
        assert cls.__qualname__ == name and cls.__module__ == "diffusers_ascend.layers"
        assert getattr(layers, name) is cls  # built once: Dynamo sees one class per swap
    # The family-specific processors are plain module-level classes of their adapter.
    from diffusers_ascend.adapters import flux, wan

    for module, name in ((flux, "FusedRopeFluxAttnProcessor"), (wan, "FusedRopeWanAttnProcessor")):
        cls = getattr(module, name)
        assert cls.__qualname__ == name and cls.__module__ == module.__name__
    assert issubclass(layers.FastGELU, layers.FusedGELU)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        layers.Nope  # noqa: B018  (the attribute access is the test)
