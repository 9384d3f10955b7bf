"""Test matrix over the torch releases the Ascend stack ships (one nox session per release).

    nox -s "engine-2.8"          # fusion-engine tests on torch 2.8.0
    nox -t engine                # every release of the matrix
    nox -t engine-by-hand        # releases run by hand (2.8, 2.9, 2.12), not in CI
    nox -s simhost-2.10          # the simulated Ascend host alone, whole zoo (CI runs it in engine-2.10)
    nox -s lint                  # ruff check and ruff format --check (CI's first stage)
    nox -l                       # list the sessions

The engine tests are the ones that reach torch internals: ops, passes, backend, integration on
Flux and Wan. The full suite runs on the release the README pins (see `.ci/run`). PyPI's Linux
torch wheels are CUDA builds; they import and run on a CPU-only machine.
"""

from __future__ import annotations

import os

import nox

nox.options.reuse_venv = "yes"
# uv fetches a CUDA torch (~3 GB) in parallel streams and links it from its cache, several times
# faster than pip on a fresh machine (figures in docs/support-matrix.md); venv where uv is missing.
nox.options.default_venv_backend = "uv|venv"
# What `python -m venv` puts in a 3.11 environment and uv does not: Inductor's C++ builder on some
# releases (2.10) imports setuptools without declaring it.
SEED = ("setuptools",)
# A local wheel directory pip is told about (the README's CPU torch) is one uv must see too.
if os.environ.get("PIP_FIND_LINKS") and not os.environ.get("UV_FIND_LINKS"):
    os.environ["UV_FIND_LINKS"] = os.environ["PIP_FIND_LINKS"]

# torch releases CI verifies besides the README's pin (2.13, full suite): the floor of
# pyproject.toml, the releases Ascend hosts hold (2.10, the one vLLM-Ascend and MindIE SD 3.1
# images pin; 2.11), and the two newest (2.15 is `_compat.TORCH_NEWEST_VERIFIED`). Session times
# on a fresh 2-core machine are in docs/support-matrix.md; this set keeps `.ci/run` inside an hour.
TORCH = {"2.6": "2.6.0", "2.10": "2.10.0", "2.11": "2.11.0", "2.14": "2.14.1", "2.15": "2.15.0"}
# Releases run by hand, not in CI (`nox -s engine-2.8`): 2.8 sits between the floor and 2.10 on
# every `_compat` switch; torch_npu's 26.1.0 line pairs 2.9 to 2.12, whose neighbours CI runs.
# Results in docs/support-matrix.md.
TORCH_BY_HAND = {"2.8": "2.8.0", "2.9": "2.9.1", "2.12": "2.12.1"}

# What runs on every release: the tests that reach the torch internals that move between releases.
# - tests/compilation: every pass's patterns and exact counts (passes/, one file per fusion), the shims and each
#   pass matching its own forms (test_compat), the backend, executors, freezing, recompiles, shared
#   processors, graph capture through its stand-ins: all of it is Inductor / dynamo / aot_autograd.
# - tests/kernels' registration tests (torch.library custom_op / register_fake / register_autograd /
#   opcheck, the provider registry). Left out: test_ops (eager numerics of the reference math, plain
#   tensor ops), test_npu_contract (torch_npu stand-ins, plain Python), test_testing (tolerances),
#   test_npu_hardware (NPU only): they do not differ by release and run in the full suite.
# - the pipelines (tests/integration/test_pipelines.py) and the model adapters (tests/models/
#   test_adapters.py): Flux and Wan end to end through enable_ascend_compile.
# - warm start (tests/test_warm_start.py): torch's portable caches and AOTInductor packages, whose
#   APIs and save-time behaviour differ by release (2.6 has no portable cache; 2.8 and 2.11 fail the
#   package check). Not on 2.14, whose neighbours 2.13 (full suite) and 2.15 pass the check alike.
# - eager warm start (tests/test_warm_start_eager.py, about 35 s): torch.export (non-strict) and its
#   schema serializer, which `_compat` reads with its own converter: which releases carry eager
#   packages, the NPU default executor's warm start (docs/warm-start.md#torch-releases).
# - tests/triton/test_traceable.py: the kernels' triton_ops as Inductor traces them, a torch
#   internal (higher-order op, functionalization); PyPI's CUDA torch wheels bring their own triton,
#   so tests/triton/test_compile.py also compiles every launch with that release's Triton (3.2 with
#   torch 2.6 is the base of triton-ascend 3.2: its rope once issued 16-bit loads that 3.9 vectorized).
ENGINE_TESTS = [
    "tests/compilation",
    "tests/kernels/test_opcheck.py",
    "tests/kernels/test_autograd.py",
    "tests/kernels/test_import.py",
    "tests/kernels/test_registry.py",
    "tests/integration/test_pipelines.py",
    "tests/models/test_adapters.py",
    "tests/test_warm_start.py",
    "tests/test_warm_start_eager.py",
    "tests/triton/test_traceable.py",
    "tests/triton/test_compile.py",
]
# The 48-model zoo (tests/models/test_zoo.py, the longest engine module) where the engine's
# behaviour beyond the patterns changes: it differs by release through `_compat` switches with
# boundaries at 2.8 (`compiled_blocks_share_graphs`: shared attention processors below) and 2.11
# (`conj_views_reach_graphs`: the bare-conjugate rope form below). CI runs it on 2.10 (what
# Ascend hosts run: the new processors with the old rope form) besides the full suite on 2.13 (both
# new sides); the floor's old-processor side is covered there by the pass, adapter and
# shared-processor tests, and the by-hand sessions run the zoo. Every pass's own forms and counts
# still run on every release above.
ZOO_RELEASES = {"2.10"}
WARM_START_SKIPPED = {"2.14"}

# The simulated Ascend host as diffusers sees it (tests/simhost, contract tests, not hardware): a
# second pytest process whose PYTHONPATH starts with a stand-in torch_npu distribution, so diffusers
# finds torch_npu at its import and takes its own NPU branches. It runs on 2.10 (what Ascend hosts
# pin) inside the engine-2.10 session's environment (no second torch download in CI), with the
# zoo's `tests.simhost.zoo_npu.CI_SUBSET`; `nox -s simhost-2.10` runs it alone, with the whole zoo.
# The wheel binding test runs here too: every call we make, recorded in a process where diffusers
# saw torch_npu, bound against the torch_npu 2.10.0.post6 / 2.14.0 schemas.
SIMHOST_TESTS = ["tests/simhost", "tests/kernels/test_npu_wheel_bindings.py"]
SIMHOST_RELEASES = {"2.10"}


@nox.session(name="lint", python="3.11")
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check, as `.ci/run`'s first stage runs them.

    The `lint` extra's pinned ruff alone (not the package, whose install pulls torch); the settings
    are pyproject.toml's."""
    import tomllib  # Python >= 3.11, as every session here (the package's floor is 3.10)

    with open("pyproject.toml", "rb") as f:
        session.install(*tomllib.load(f)["project"]["optional-dependencies"]["lint"])
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


def _install_torch(session: nox.Session, version: str) -> None:
    # One resolve with torch pinned: a dependency that wants a newer torch fails here instead of
    # silently upgrading the release under test.
    session.install(f"torch=={version}", "-e", ".[test]", *SEED)
    session.run(
        "python",
        "-c",
        f"import torch; print('torch', torch.__version__); "
        f"assert torch.__version__.split('+')[0] == {version!r}, 'the session must run torch {version}'",
    )


def _pytest(session: nox.Session, *tests: str, xdist: bool = True, env: dict | None = None) -> None:
    """pytest on `tests` with the caller's arguments; exit 5 (the selection, with the caller's -k /
    -m, holds no tests) is no failure. ``xdist=False``: one process (the Triton sessions)."""
    workers = ("-n", "2") if xdist else ("-p", "no:xdist")
    session.run("python", "-m", "pytest", "-q", *workers, *tests, *session.posargs, env=env, success_codes=[0, 5])


def _engine(session: nox.Session, version: str, zoo: bool, warm_start: bool) -> None:
    _install_torch(session, version)
    tests = [t for t in ENGINE_TESTS if warm_start or t != "tests/test_warm_start.py"]
    tests += ["tests/models/test_zoo.py"] if zoo else []
    _pytest(session, *tests)
    if _short_of(version) in SIMHOST_RELEASES:
        _simhost(session, zoo="subset")


def _short_of(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _simhost(session: nox.Session, zoo: str) -> None:
    """The simulated-host suite in its own process (see `SIMHOST_TESTS`); ``zoo``: ``"subset"`` or ``"all"``."""
    site = os.path.join(os.getcwd(), "tests", "simhost", "site")
    env = {"PYTHONPATH": os.pathsep.join([site, os.getcwd()]), "DIFFUSERS_ASCEND_SIMHOST_ZOO": zoo}
    _pytest(session, *SIMHOST_TESTS, env=env)


for _short, _version in {**TORCH, **TORCH_BY_HAND}.items():
    # One named session per release ("engine-2.8"); CI's releases are tagged "engine" (`nox -t
    # engine` runs them all), the by-hand ones "engine-by-hand" (with the zoo).
    nox.session(name=f"engine-{_short}", python="3.11", tags=["engine" if _short in TORCH else "engine-by-hand"])(
        lambda session, _v=_version, _z=_short in ZOO_RELEASES or _short in TORCH_BY_HAND, _w=_short not in WARM_START_SKIPPED: (
            _engine(session, _v, _z, _w)
        )
    )


for _short in SIMHOST_RELEASES:
    # By hand (not tagged for CI, which runs the suite inside engine-2.10): the simulated host alone,
    # with the whole zoo.
    nox.session(name=f"simhost-{_short}", python="3.11", tags=["simhost"])(
        lambda session, _v=TORCH[_short]: (_install_torch(session, _v), _simhost(session, zoo="all"))
    )


@nox.session(name="triton-interpret", python="3.11", tags=["triton"])
def triton_interpret(session: nox.Session) -> None:
    """The Triton kernels on CPU, no GPU (tests/triton), on the README's torch: numerics in Triton's
    interpreter, then every launch compiled for sm_90/sm_80 with triton's own toolchain and the
    triton_op forms traced as Inductor traces them (fake CUDA tensors).

    The interpreter is chosen when triton is first imported, so TRITON_INTERPRET=1 is set for the
    whole pytest process; the main suite (without it) skips the interpreter tests.
    """
    session.install("torch==2.13.0", "-e", ".[test]", "triton", "numpy", *SEED)
    session.run("python", "-c", "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)")
    _pytest(session, "tests/triton", xdist=False, env={"TRITON_INTERPRET": "1"})
    _pytest(session, "tests/triton/test_compile.py", "tests/triton/test_traceable.py", xdist=False)


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
    session.install("-e", ".", "pytest", "numpy<2.4", "pybind11", f"triton-ascend=={TRITON_ASCEND}", *SEED)
    session.run(
        "python",
        "-c",
        "import importlib.metadata as m, torch; "
        "print('torch', torch.__version__, 'triton-ascend', m.version('triton-ascend'))",
    )
    _pytest(session, "tests/triton/test_ascend_lowering.py", xdist=False)
    _pytest(
        session,
        "tests/triton/test_kernels.py",
        "tests/triton/test_blocks.py",
        xdist=False,
        env={"TRITON_INTERPRET": "1"},
    )
