"""Test matrix over the torch releases the Ascend stack ships (one nox session per release).

    nox -s "engine-2.8"          # fusion-engine tests on torch 2.8.0
    nox -t engine                # every release of the matrix
    nox -l                       # list the sessions

The engine tests are the ones that reach torch internals: ops, passes, backend, integration on
Flux and Wan. The full suite runs on the release the README pins (see `.ci/run`). PyPI's Linux
torch wheels are CUDA builds; they import and run on a CPU-only machine.
"""

from __future__ import annotations

import nox

nox.options.reuse_venv = "yes"
nox.options.default_venv_backend = "venv"

# torch releases CI verifies besides the README's pin (2.13, full suite): the floor of
# pyproject.toml, the releases Ascend hosts hold (torch_npu pairs for CANN 8.x / 9.x), and the
# newest release (`_compat.TORCH_NEWEST_VERIFIED`).
TORCH = {"2.6": "2.6.0", "2.8": "2.8.0", "2.10": "2.10.0", "2.11": "2.11.0", "2.14": "2.14.1", "2.15": "2.15.0"}

# tests/triton/test_traceable.py: the kernels' triton_ops as Inductor traces them, a torch internal
# (higher-order op, functionalization); PyPI's CUDA torch wheels bring their own triton, so
# tests/triton/test_compile.py also compiles every launch with that release's Triton (3.2 with
# torch 2.6 is the base of triton-ascend 3.2: its rope once issued 16-bit loads that 3.9 vectorized).
# tests/models: the 48-model zoo, because the engine differs by release beyond the patterns (the
# shared attention processors below 2.8, the conjugate-view rope form below 2.11).
ENGINE_TESTS = ["tests/kernels", "tests/compilation", "tests/integration/test_pipelines.py", "tests/test_warm_start.py",
                "tests/triton/test_traceable.py", "tests/triton/test_compile.py", "tests/models"]


def _engine(session: nox.Session, version: str) -> None:
    session.install(f"torch=={version}")
    session.install("-e", ".[test]")
    session.run("python", "-c", "import torch; print('torch', torch.__version__)")
    session.run("python", "-m", "pytest", "-q", "-n", "2", *ENGINE_TESTS, *session.posargs)


for _short, _version in TORCH.items():
    # One named session per release ("engine-2.8"), all tagged "engine": `nox -t engine` runs them all.
    nox.session(name=f"engine-{_short}", python="3.11", tags=["engine"])(
        lambda session, _v=_version: _engine(session, _v)
    )


@nox.session(name="triton-interpret", python="3.11", tags=["triton"])
def triton_interpret(session: nox.Session) -> None:
    """The Triton kernels on CPU, no GPU (tests/triton), on the README's torch: numerics in Triton's
    interpreter, then every launch compiled for sm_90/sm_80 with triton's own toolchain and the
    triton_op forms traced as Inductor traces them (fake CUDA tensors).

    The interpreter is chosen when triton is first imported, so TRITON_INTERPRET=1 is set for the
    whole pytest process; the main suite (without it) skips the interpreter tests.
    """
    session.install("torch==2.13.0")
    session.install("-e", ".[test]", "triton", "numpy")
    session.run("python", "-c", "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)")
    session.run("python", "-m", "pytest", "-q", "-p", "no:xdist", "tests/triton", *session.posargs,
                env={"TRITON_INTERPRET": "1"})
    session.run("python", "-m", "pytest", "-q", "-p", "no:xdist", "tests/triton/test_compile.py",
                "tests/triton/test_traceable.py", *session.posargs)


# The triton-ascend release whose API tests/triton/test_ascend_lowering.py drives (3.2.0 is the
# newest on PyPI with Linux x86-64 wheels for Python 3.11).
TRITON_ASCEND = "3.2.0"


@nox.session(name="triton-ascend", python="3.11", tags=["triton"])
def triton_ascend(session: nox.Session) -> None:
    """The kernels lowered as triton-ascend lowers them for an Ascend 910B, up to the linalg that CANN
    compiles (tests/triton/test_ascend_lowering.py): no NPU, no CANN. Then their numerics in
    triton-ascend's own interpreter (its Python frontend: `tl.split`/`tl.join`/`tl.reshape` as it
    defines them), against the native ops on CPU. triton-ascend installs as the ``triton`` module,
    so it gets its own environment; pybind11 is a dependency it does not declare, and numpy stays
    below 2.4, whose ``int()`` of a one-element array (an error since 2.4) its interpreter uses."""
    session.install("torch==2.13.0")
    session.install("-e", ".", "pytest", "numpy<2.4", "pybind11", f"triton-ascend=={TRITON_ASCEND}")
    session.run("python", "-c", "import importlib.metadata as m, torch; "
                "print('torch', torch.__version__, 'triton-ascend', m.version('triton-ascend'))")
    session.run("python", "-m", "pytest", "-q", "-p", "no:xdist", "tests/triton/test_ascend_lowering.py", *session.posargs)
    session.run("python", "-m", "pytest", "-q", "-p", "no:xdist", "tests/triton/test_kernels.py",
                "tests/triton/test_blocks.py", *session.posargs, env={"TRITON_INTERPRET": "1"})
