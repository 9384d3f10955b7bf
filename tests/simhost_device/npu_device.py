"""A simulated ``npu`` device over host memory, for CONTRACT tests (no Ascend hardware exists here).

Tensors really are on a device named ``npu`` (``tensor.device.type == "npu"``): PrivateUse1,
renamed, with the small C++ backend in ``npu_device.cpp`` (built once with
``torch.utils.cpp_extension``; see docs/simulated-npu-device.md). It models a 2-card host:
``npu:0`` and ``npu:1`` (`DEVICES`), with a current device per thread; another index is refused
with torch_npu's error for it. Its memory is host memory and its kernels are the CPU's, reached
through a fallback that refuses tensors of other devices (``cpu``, or the other ``npu``), so the
numbers equal the CPU's and any code that forgets to move a tensor fails as on a real NPU host.
The NPU's documented limits are enforced: no float64 / complex128 tensor can exist on it.

It proves nothing about NPU kernels, speed or memory. `install` is irreversible and
process-global (PrivateUse1 is renamed once per process): call it only in a dedicated process
(`tests/simhost_device/test_npu_device.py` spawns one).

``torch.npu`` is `device_module()`: what torch_npu's ``torch.npu`` offers that torch and this
package ask for (``is_available``, ``device_count``, ``current_device``, ``set_device``,
``synchronize``, ``Stream``, ``Event``, ``stream``, ``current_stream``, ``manual_seed_all``, ...)
plus the graph stand-in (``NPUGraph``, ``graph``, ``graph_pool_handle``: tests/compilation/
graph_standins.py), which records and replays the ops dispatched inside a capture, here on
``npu`` tensors.
"""

from __future__ import annotations

import contextlib
import functools
import os
import types

import torch

__all__ = ["BACKEND", "DEVICES", "device_module", "fallback_count", "install", "installed", "npu_device_host"]

BACKEND = "npu"
DEVICES = 2  # npu:0 and npu:1, as on a 2-card host (kDevices in npu_device.cpp)
_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "npu_device.cpp")


@functools.lru_cache(maxsize=1)
def _extension():
    """The compiled backend (built on first use, cached by torch in ``TORCH_EXTENSIONS_DIR``)."""
    from torch.utils.cpp_extension import load

    return load(name="diffusers_ascend_simulated_npu", sources=[_SOURCE], extra_cflags=["-O2"], verbose=False)


def _index(device=None) -> int:
    """The device index ``device`` names (None, an int, ``"npu:1"``, a torch.device); the current
    device where it names none. An index the host does not have raises (the backend's check)."""
    ext = _extension()
    if device is None:
        return ext.current_device()
    if isinstance(device, int):
        index = device
    else:
        device = torch.device(device)
        if device.type != BACKEND:
            raise ValueError(f"Expected a {BACKEND} device, but got: {device}")
        index = ext.current_device() if device.index is None else device.index
    ext.memory_allocated(index)  # raises torch_npu's invalid-device error for an index the host lacks
    return index


class _Stream:
    """A device's one stream (``torch.npu.Stream``): work runs in order on the host."""

    def __init__(self, device=None, priority: int = 0) -> None:
        self._device = torch.device(BACKEND, _index(device))

    @property
    def device(self) -> torch.device:
        return self._device

    def wait_stream(self, other) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None):
        return event if event is not None else _Event()

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class _Event:
    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        pass

    def record(self, stream=None) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


_STREAMS: dict = {}  # device index -> its one stream


def _stream_of(device=None) -> _Stream:
    index = _index(device)
    return _STREAMS.setdefault(index, _Stream(index))


class _DeviceContext:
    """``torch.npu.device(index)``: makes a device current for the block."""

    def __init__(self, device) -> None:
        self.index, self.saved = _index(device), None

    def __enter__(self):
        self.saved = _extension().current_device()
        _extension().set_device(self.index)
        return self

    def __exit__(self, *exc) -> bool:
        _extension().set_device(self.saved)
        return False


def device_module() -> types.ModuleType:
    """A ``torch.npu`` for the simulated device (see the module docstring)."""
    from tests.compilation.graph_standins import standin_torch_npu_graphs

    ext = _extension()
    graphs = standin_torch_npu_graphs()
    mod = types.ModuleType("torch.npu")

    mod.__dict__.update(
        is_available=lambda: True,
        is_initialized=lambda: True,
        _is_in_bad_fork=lambda: False,
        _lazy_init=lambda: None,
        device_count=ext.device_count,
        current_device=ext.current_device,
        set_device=lambda device: ext.set_device(_index(device)),
        device=_DeviceContext,
        synchronize=lambda device=None: _index(device) and None,
        get_device_name=lambda device=None: "Ascend910B2 (simulated)",
        manual_seed=lambda seed: None,
        manual_seed_all=lambda seed: None,
        seed=lambda: None,
        seed_all=lambda: None,
        Stream=_Stream,
        Event=_Event,
        current_stream=_stream_of,
        default_stream=_stream_of,
        stream=lambda s=None: contextlib.nullcontext(s),
        memory_allocated=lambda device=None: ext.memory_allocated(_index(device)),
        empty_cache=lambda: None,
        get_amp_supported_dtype=lambda: [torch.float16, torch.bfloat16],
        NPUGraph=graphs.NPUGraph,
        graph=graphs.graph,
        graph_pool_handle=graphs.graph_pool_handle,
    )
    return mod


def fallback_count() -> int:
    """How many ops the device has run through its CPU-kernel fallback in this process."""
    return _extension().fallback_count()


def installed() -> bool:
    """Whether this process's PrivateUse1 is the simulated ``npu``."""
    return torch._C._get_privateuse1_backend_name() == BACKEND and isinstance(
        getattr(torch, "npu", None), types.ModuleType
    )


def install() -> types.ModuleType:
    """Registers the simulated ``npu`` device in this process (irreversible: a dedicated process only).

    Returns:
        the ``torch.npu`` module it registered.
    """
    if installed():
        return torch.npu
    _extension()  # the kernels, allocator, guard and hooks register when the library loads
    torch.utils.rename_privateuse1_backend(BACKEND)
    torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=True)
    module = device_module()
    torch._register_device_module(BACKEND, module)
    return module


@contextlib.contextmanager
def npu_device_host(monkeypatch, **torch_npu_kw):
    """The simulated Ascend host on the ``npu`` device, for the ``with`` block.

    What the CPU-tensor host (tests/simulated_npu.py) widens, this leaves as the product ships it:
    the npu providers take ``npu`` tensors only (``ascend_kernels.npu.DEVICE_TYPES``), platform
    detection runs unpatched (it finds ``torch_npu``, the stand-in, and ``torch.npu.is_available()``)
    and `diffusers_ascend.platform.graph_api` returns its NPU branch (``device_type="npu"``).

    Yields:
        `tests.simulated_npu.SimulatedNpu` (the stand-in torch_npu and ``torch.npu``).
    """
    from diffusers.models import attention_dispatch

    from ascend_kernels import npu as npu_providers
    from diffusers_ascend import platform as platform_mod
    from tests.kernels.npu_standins import install_torch_npu
    from tests.simulated_npu import SimulatedNpu

    assert installed(), "install() the simulated npu device first (in a dedicated process)"
    shipped = npu_providers.DEVICE_TYPES
    fake = install_torch_npu(monkeypatch, **torch_npu_kw)
    # install_torch_npu widens the providers to CPU tensors for the CPU-tensor host; here they are on npu.
    monkeypatch.setattr(npu_providers, "DEVICE_TYPES", shipped)
    monkeypatch.setattr(attention_dispatch, "npu_fusion_attention", fake.npu_fusion_attention, raising=False)
    monkeypatch.setattr(attention_dispatch, "_CAN_USE_NPU_ATTN", True)  # computed at diffusers' import
    platform_mod._detect.cache_clear()
    try:
        yield SimulatedNpu(fake, torch.npu)
    finally:
        platform_mod._detect.cache_clear()
