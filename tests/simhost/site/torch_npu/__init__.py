"""STAND-IN torch_npu for the simulated Ascend host: CONTRACT tests, not hardware, not the real package.

Only the simulated-host session puts this directory on ``PYTHONPATH`` (``nox -s simhost-2.10``,
tests/simhost/conftest.py), so that diffusers finds a torch_npu distribution at its import and
takes every NPU branch it has. It is no package of diffusers-ascend's build (pyproject's find
includes ``ascend_kernels*`` and ``diffusers_ascend*`` only). The module's attributes come from a
`tests.simhost.torch_npu_standin.SimHostTorchNpu` built from the repository's stand-ins: this
plain module holds its ops, ``npu`` and ``__version__``; ``_standin`` the stand-in's state.
"""

try:
    from tests.simhost.torch_npu_standin import SimHostTorchNpu
except ModuleNotFoundError as e:  # pragma: no cover - only outside the repository's test process
    if e.name not in ("tests", "tests.simhost", "tests.simhost.torch_npu_standin"):
        raise
    raise ImportError(
        "this torch_npu is the STAND-IN of diffusers-ascend's simulated-host contract tests; it runs only "
        "from a diffusers-ascend checkout (nox -s simhost-2.10), never as an installed package"
    ) from e

globals().update(SimHostTorchNpu().exports())
