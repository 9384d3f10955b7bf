"""Every warning diffusers-ascend emits is an `AscendWarning` starting with ``"diffusers-ascend: "``,
so a service can filter ours (docs/troubleshooting.md#filtering-our-warnings). Each case runs one
real path that warns and checks every warning of ours it raised; the architecture test beside them
keeps new code on `diffusers_ascend.errors.warn`."""

from __future__ import annotations

import ast
import pathlib
import warnings

import pytest
import torch

import diffusers_ascend
from diffusers_ascend import AscendWarning
from diffusers_ascend.compilation import AscendBackend, _compat
from diffusers_ascend.compilation.graph_capture import GraphCaptureManager
from diffusers_ascend.config import CONFIG_VERSION, AscendConfig
from diffusers_ascend.errors import PREFIX
from diffusers_ascend.tiny import tiny_flux_transformer

ROOT = pathlib.Path(__file__).resolve().parents[1]
BARE_WARN_ALLOWED: set[str] = set()  # modules allowed a bare warnings.warn: none


def _ours(record) -> list[warnings.WarningMessage]:
    """The warnings of `record` raised by our code or attributed to its caller: not torch's or
    diffusers' own (site-packages), nor deprecations."""
    return [
        w
        for w in record
        if "site-packages" not in w.filename
        and not issubclass(w.category, (DeprecationWarning, PendingDeprecationWarning, FutureWarning))
    ]


def _newer_config():
    AscendConfig.from_dict({"version": CONFIG_VERSION + 1, "fusions": ["rope"], "turbo": True})


def _failed_rewrite():
    backend = AscendBackend(fusions=["rms_norm"], executor="eager")

    def broken(graph, after_step=None):
        raise RuntimeError("boom")

    backend.manager = broken
    with torch.no_grad():
        torch.compile(torch.nn.RMSNorm(8), backend=backend)(torch.randn(2, 8))


def _uncaptured_graph():
    manager = GraphCaptureManager("graph_only", api=None)
    manager.blocked = "jit_compile=True sends every op to acl_op"
    manager.wrap(lambda *args: args, name="g000")


def _untested_torch(monkeypatch):
    monkeypatch.setattr(_compat, "support_status", lambda: ("newer than verified", "torch 9.9 is newer than verified"))
    _compat._warn_untested.cache_clear()  # said once per process: this case must see it
    try:
        _compat.check_engine(fusions=False)
    finally:
        _compat._warn_untested.cache_clear()


def _foreign_compile():
    model = tiny_flux_transformer(num_layers=1, num_single_layers=1)
    diffusers_ascend.enable_ascend_compile(model, executor="eager", fusions="none")
    model.compile(backend="eager")  # another torch.compile of the whole model: ours never runs
    diffusers_ascend.ascend_report(model)


@pytest.mark.parametrize(
    "case, needle",
    [
        (lambda mp: _newer_config(), "is newer than this diffusers-ascend supports"),
        (lambda mp: _failed_rewrite(), "rewriting graph g000"),
        (lambda mp: _uncaptured_graph(), "graph g000 runs without graph capture"),
        (_untested_torch, "torch 9.9 is newer than verified"),
        pytest.param(lambda mp: _foreign_compile(), "compiled by another torch.compile"),
    ],
    ids=["config", "backend", "graph_capture", "compat", "foreign_compile"],
)
def test_every_warning_is_an_ascend_warning_with_the_prefix(monkeypatch, case, needle):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        case(monkeypatch)
    ours = _ours(record)
    assert any(needle in str(w.message) for w in ours), [str(w.message) for w in record]
    assert [(w.category, str(w.message)[: len(PREFIX)]) for w in ours] == [(AscendWarning, PREFIX)] * len(ours)


def test_users_filter_ours_apart():
    # As docs/troubleshooting.md shows: ours escalated to errors, everyone else's untouched.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        warnings.filterwarnings("error", category=AscendWarning)
        warnings.warn("someone else's", UserWarning, stacklevel=1)
        with pytest.raises(AscendWarning, match=f"^{PREFIX}"):
            _newer_config()
    assert issubclass(AscendWarning, UserWarning) and diffusers_ascend.AscendWarning is AscendWarning


def _bare_warn_calls(path: pathlib.Path) -> list[int]:
    tree = ast.parse(path.read_text())
    names = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "warnings"
        for alias in node.names
        if alias.name in ("warn", "warn_explicit")
    }
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if (
            isinstance(f, ast.Attribute)
            and f.attr in ("warn", "warn_explicit")
            and isinstance(f.value, ast.Name)
            and f.value.id == "warnings"
        ) or (isinstance(f, ast.Name) and f.id in names):
            lines.append(node.lineno)
    return lines


def test_no_bare_warnings_warn_outside_errors_py():
    found = {}
    for top in ("diffusers_ascend", "ascend_kernels"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel != "diffusers_ascend/errors.py" and rel not in BARE_WARN_ALLOWED and _bare_warn_calls(path):
                found[rel] = _bare_warn_calls(path)
    assert found == {}, "warn through diffusers_ascend.errors.warn (AscendWarning, one prefix)"


def test_the_check_sees_a_bare_warn(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import warnings\nfrom warnings import warn as w\nwarnings.warn('x')\nw('y')\nwarn('z')\n")
    assert _bare_warn_calls(path) == [3, 4]
