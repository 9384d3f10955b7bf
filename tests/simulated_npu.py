"""A simulated Ascend host for CONTRACT tests: the `simulated_npu` fixture (tests/conftest.py).

It is not hardware and proves nothing about NPU kernels' speed or exact numerics. It makes the
NPU code paths of diffusers-ascend run on the CPU against stand-ins that implement what torch_npu
documents, so a change that breaks a documented contract fails here:

- ``torch_npu``: `tests.kernels.npu_standins.StandInTorchNpu` (fused-op schemas per op-plugin
  release, FIA and ``npu_fusion_attention`` as ``npu::`` torch.library ops with their schemas);
  the npu providers take CPU tensors (``ascend_kernels.npu.DEVICE_TYPES``);
- ``torch.npu``: ``NPUGraph``, ``graph(npu_graph, pool=None, stream=None,
  auto_dispatch_capture=False, capture_error_mode="global")`` (torch_npu/npu/graphs.py: the
  keyword is ``npu_graph``), ``graph_pool_handle``, ``Stream``, ``stream``, ``current_stream``,
  over `tests.compilation.graph_standins.StandInGraph` (capture records the dispatched ops and
  poisons their results; replay re-runs them on the captured tensors), with what ``graph`` does
  around a capture in torch_npu 2.10.0.post6 / 2.14.0 (synchronize and cache emptying counted in
  ``npu.runtime``, acl_op kernels and ``TASK_QUEUE_ENABLE=2`` refused, ``capture_error_mode``);
- the platform is ``"npu"`` (`override_platform`), and `diffusers_ascend.platform.graph_api`
  returns its real NPU branch built on that ``torch.npu``, with ``device_type="cpu"`` (the
  simulated device's tensors live on the CPU);
- diffusers' ``_native_npu`` backend calls the stand-in ``npu_fusion_attention`` and passes its
  requirement check (diffusers imports the op and sets ``_CAN_USE_NPU_ATTN`` at its own import).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import types

import torch

from diffusers_ascend import platform as platform_mod

from .compilation.graph_standins import standin_torch_npu_graphs
from .kernels.npu_standins import StandInTorchNpu, install_torch_npu

__all__ = ["SimulatedNpu", "simulated_npu_host"]


@dataclasses.dataclass
class SimulatedNpu:
    """What the fixture installed: the stand-in ``torch_npu`` (its ``calls``) and ``torch.npu``."""

    torch_npu: StandInTorchNpu
    npu: types.SimpleNamespace

    def calls(self, name: str) -> list[dict]:
        """The recorded calls of stand-in op ``name`` (bound arguments)."""
        return [bound for op, bound in self.torch_npu.calls if op == name]


@contextlib.contextmanager
def simulated_npu_host(monkeypatch, **torch_npu_kw):
    """Installs the simulated host (see the module docstring) for the ``with`` block; undone by
    ``monkeypatch`` and the context exit."""
    from diffusers.models import attention_dispatch

    fake = install_torch_npu(monkeypatch, **torch_npu_kw)
    npu = standin_torch_npu_graphs()
    monkeypatch.setattr(torch, "npu", npu, raising=False)
    real_graph_api = platform_mod.graph_api

    def graph_api(platform=None):
        api = real_graph_api(platform)
        if api is not None and api.device_type == "npu":
            api = dataclasses.replace(api, device_type="cpu")
        return api

    monkeypatch.setattr(platform_mod, "graph_api", graph_api)
    # Detection is cached per process: answer for the simulated host without caching it.
    monkeypatch.setattr(platform_mod, "_detect", lambda: ("npu", None))
    monkeypatch.setattr(attention_dispatch, "npu_fusion_attention", fake.npu_fusion_attention, raising=False)
    monkeypatch.setattr(attention_dispatch, "_CAN_USE_NPU_ATTN", True)  # computed at diffusers' import
    assert "npu_graph" in inspect.signature(npu.graph).parameters
    with platform_mod.override_platform("npu"):
        yield SimulatedNpu(fake, npu)
