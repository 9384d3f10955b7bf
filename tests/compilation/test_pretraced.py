"""Pre-traced search graphs (`passes/pretraced.py`, issue 36): a process registers the patterns a
process before it traced, with no trace of its own, and gets the same matchers; a file for another
torch build or pattern code, or one that is not exactly what we write, is never read."""

import json
import re
import warnings

import pytest
import torch

from diffusers_ascend import fusions as F
from diffusers_ascend.compilation.passes import base, get_pass_class, pretraced, verdict

# Every fusion "all" runs, plus the numerics-changing ones: each pass file registers through here.
ALL = [f for f in F.PASS_ORDER if f in F.FUSIONS]


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(verdict.ENV, str(tmp_path / "verdicts"))
    return tmp_path / "verdicts" / "patterns"


@pytest.fixture
def initial_traces(monkeypatch):
    """Traces on real example inputs (registration), as opposed to the fake-tensor traces at a match."""
    calls = []
    real = base.trace_functional

    def counting(fn, args, **kwargs):
        if not any(isinstance(a, torch._subclasses.FakeTensor) for a in torch.utils._pytree.tree_leaves(list(args))):
            calls.append(fn)
        return real(fn, args, **kwargs)

    monkeypatch.setattr(base, "trace_functional", counting)
    return calls


def _register(cls):
    """A fresh registration of `cls`'s patterns, as a new process makes it (no functools cache)."""
    return base._registered_impl.__wrapped__(cls)


def _patterns(passes) -> dict[str, list[str]]:
    from torch._inductor.pattern_matcher import PatternPrettyPrinter

    return {
        group: sorted(PatternPrettyPrinter.run(entry.pattern) for entries in pm.patterns.values() for entry in entries)
        for group, pm in passes.items()
    }


def _replacements_of_own_forms(cls, passes) -> dict[str, int]:
    counts = {}
    for pattern in cls.patterns():
        if pattern.group not in counts:
            counts[pattern.group] = passes[pattern.group].apply(pattern.probe_graph())
    return counts


@pytest.mark.parametrize("fusion", ALL)
def test_a_later_process_registers_the_same_patterns_without_tracing(cache_dir, initial_traces, fusion):
    cls = get_pass_class(fusion)
    traced = _register(cls)
    n_traced = len(initial_traces)
    written = list(cache_dir.glob("*.json")) if cache_dir.exists() else []
    if n_traced == 0:  # every pattern of this fusion is hand-built: nothing to trace, nothing written
        assert written == []
        return
    assert [p.name for p in written] == [f"{pretraced.cache_key(cls)}.json"]

    cached = _register(cls)
    assert len(initial_traces) == n_traced  # not one search function traced again
    assert _patterns(cached) == _patterns(traced)
    # The self-check's proof on the cached registration: each form is replaced exactly once.
    counts = _replacements_of_own_forms(cls, cached)
    assert counts and set(counts.values()) == {1}, counts


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ["flux_double", "wan"])
def test_a_real_block_fuses_alike_from_cached_patterns(cache_dir, initial_traces, name, dtype):
    """Real diffusers blocks, every fusion of "all": a process that registered from the cache makes
    the expected replacements and gives eager's numbers."""
    import copy

    from .conftest import ALL as DEFAULT
    from .conftest import (
        EXPECTED_BLOCK_COUNTS,
        SnapshotBackend,
        as_tuple,
        assert_as_accurate_as_eager,
        assert_close,
        compile_module,
        to_fp64,
    )
    from .test_blocks import make_block

    for fusion in DEFAULT:  # the first process: traces and writes
        _register(get_pass_class(fusion))
    n_traced = len(initial_traces)
    base._registered_impl.cache_clear()  # the next process
    try:
        block, inputs = make_block(name, dtype)
        backend = SnapshotBackend(fusions="all", executor="eager")
        with torch.no_grad():
            out = as_tuple(compile_module(block, backend)(**inputs))
            ref = as_tuple(block(**inputs))
            ref64 = as_tuple(copy.deepcopy(block).double()(**to_fp64(inputs)))
        assert len(initial_traces) == n_traced  # registered from the cache
        assert backend.report.matches == EXPECTED_BLOCK_COUNTS[name]
        for o, r, r64 in zip(out, ref, ref64):
            if dtype == torch.float32:
                assert_close(o, r, dtype)
            else:
                assert_as_accurate_as_eager(o, r, r64, dtype)
    finally:
        base._registered_impl.cache_clear()  # later tests register as usual


@pytest.mark.parametrize(
    "edit", ["not json", "another key", "foreign target", "unknown op", "extra field", "code in a literal"]
)
def test_a_file_that_is_not_ours_is_ignored_and_the_process_traces(cache_dir, initial_traces, edit):
    cls = get_pass_class("rms_norm")
    traced = _register(cls)
    n_traced = len(initial_traces)
    (path,) = cache_dir.glob("*.json")
    data = json.loads(path.read_text())
    name, nodes = next(iter(data["graphs"].items()))
    call = next(n for n in nodes if n["op"] == "call_function")
    if edit == "not json":
        path.write_text("{")
    elif edit == "another key":
        data["key"] = "0" * 64
    elif edit == "foreign target":
        call["target"] = "builtins.eval"
    elif edit == "unknown op":
        call["target"] = "aten.no_such_op.default"
    elif edit == "extra field":
        call["meta"] = {}
    else:
        call["args"] = {"python": "__import__('os').system('true')"}
    if edit != "not json":
        path.write_text(json.dumps(data))
    assert pretraced.load(cls) == {}
    again = _register(cls)
    assert len(initial_traces) == 2 * n_traced  # traced as without a cache
    assert _patterns(again) == _patterns(traced)


@pytest.mark.parametrize("change", ["torch version", "torch build", "pattern source"])
def test_another_torch_or_pattern_code_misses_the_cache(cache_dir, initial_traces, monkeypatch, change):
    cls = get_pass_class("rms_norm")
    _register(cls)
    n_traced = len(initial_traces)
    if change == "torch version":
        monkeypatch.setattr(torch, "__version__", torch.__version__ + ".post1")
    elif change == "torch build":
        monkeypatch.setattr(torch.version, "git_version", "0" * 40)
    else:
        real = cls.source_hash()
        monkeypatch.setattr(cls, "source_hash", classmethod(lambda c: real + "edited"))
    assert pretraced.load(cls) == {}
    _register(cls)
    assert len(initial_traces) == 2 * n_traced


def test_the_cache_turned_off_writes_nothing(tmp_path, monkeypatch, initial_traces):
    monkeypatch.setenv(verdict.ENV, "")
    monkeypatch.chdir(tmp_path)
    _register(get_pass_class("mul_add"))
    assert initial_traces and list(tmp_path.iterdir()) == []


def test_graph_json_round_trips_every_literal_kind():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    y = graph.call_function(
        torch.ops.aten.to.dtype_layout,
        (x,),
        {"dtype": torch.bfloat16, "layout": torch.strided, "device": torch.device("cpu"), "pin_memory": None},
    )
    z = graph.call_function(torch.ops.aten.add.Tensor, (y, y), {"alpha": 2.0**-20})
    w = graph.call_function(torch.ops.aten.view.default, (z, [2, -1]))
    graph.output((w, float("inf")))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    back = pretraced.graph_from_json(json.loads(json.dumps(pretraced.graph_to_json(gm))))
    assert str(back.graph) == str(gm.graph)
    nodes = list(back.graph.nodes)
    assert nodes[1].kwargs["dtype"] is torch.bfloat16 and nodes[2].kwargs["alpha"] == 2.0**-20


def test_a_graph_with_a_tensor_constant_is_not_stored():
    gm = torch.fx.symbolic_trace(torch.nn.Linear(2, 2))  # get_attr nodes: weights are not search-graph literals
    with pytest.raises(pretraced._NotStorable):
        pretraced.graph_to_json(gm)


# -- #42 item 3: an edited file is never believed, and never blamed on torch ----------------------
class PerFrame(torch.nn.Module):
    """Sana-WM's per-frame modulation (`AdaLNPattern` form ``per_frame``), its shift added or subtracted."""

    def __init__(self, sign=1):
        super().__init__()
        self.sign = sign

    def forward(self, x, scale, shift):
        y = torch.nn.functional.layer_norm(x, (x.shape[-1],), eps=1e-6).reshape(x.shape[0], scale.shape[1], -1, 16)
        y = y * (1 + scale) + shift if self.sign > 0 else y * (1 + scale) - shift
        return y.reshape(x.shape)


class FluxRotation(torch.nn.Module):
    """diffusers' `apply_rotary_emb` (`RopePattern` form ``flux``), or with the stack's halves swapped."""

    def __init__(self, swapped=False):
        super().__init__()
        self.swapped = swapped

    def forward(self, x, cos, sin):
        x_real, x_imag = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
        halves = [x_real, -x_imag] if self.swapped else [-x_imag, x_real]
        x_rotated = torch.stack(halves, dim=-1).flatten(3)
        return (x.float() * cos + x_rotated.float() * sin).to(x.dtype)


def _subtract_shift(nodes):
    (shift_add,) = [n for n in nodes if n["target"] == "aten.add.Tensor" and "mul" in json.dumps(n["args"])]
    shift_add["target"] = "aten.sub.Tensor"


def _swap_stack_halves(nodes):
    (stack,) = [n for n in nodes if n["target"] == "aten.stack.default"]
    stack["args"]["tuple"][0]["list"].reverse()


# The two edits: each turns a form's search graph into another valid graph (max |compiled -
# eager| 5.47 and 7.52 when believed), whose code is the look-alike.
EDITS = {
    "adaln shift subtracted": (
        "adaln",
        "AdaLNPattern[per_frame,",
        _subtract_shift,
        lambda edited: PerFrame(-1 if edited else 1),
        lambda: (torch.randn(2, 6, 16), torch.randn(2, 3, 1, 16), torch.randn(2, 3, 1, 16)),
    ),
    "flux rope halves swapped": (
        "rope",
        "RopePattern[flux,",
        _swap_stack_halves,
        lambda edited: FluxRotation(swapped=edited),
        lambda: (torch.randn(2, 6, 3, 8), torch.randn(1, 6, 1, 8), torch.randn(1, 6, 1, 8)),
    ),
}


@pytest.fixture
def next_process():
    """Clears this process's registrations, as a new process starts (before and after the test)."""

    def clear():
        base._registered_impl.cache_clear()
        base._verified_impl.cache_clear()

    clear()
    yield clear
    clear()


def _edit_file(cache_dir, fusion, form, edit, forge_digest=False):
    """The file of `fusion` with the graphs of `form` edited; with `forge_digest`, its digest rewritten
    to the edited bytes (a file the digest cannot tell from ours)."""
    (path,) = cache_dir.glob("*.json")
    data = json.loads(path.read_text())
    names = [k for k in data["graphs"] if form in k]
    assert names, form
    for name in names:  # every dtype variant (those without casts would stand in for each other)
        edit(data["graphs"][name])
    text = json.dumps(data)
    path.write_text(text)
    if forge_digest:
        key = pretraced.cache_key(get_pass_class(fusion))
        verdict.record_digest(key, pretraced.KIND, verdict.sha256_of(text.encode()))
    return path, text


def _compiles(fusion, module, inputs, expected):
    from .passes.harness import run

    run(module, *inputs, fusions=[fusion], dtype=torch.float32, expected=expected)


@pytest.mark.parametrize("keep_verdict", [True, False], ids=["verdict present", "verdict removed"])
@pytest.mark.parametrize("edit", list(EDITS))
def test_an_edited_pattern_file_is_dropped_with_a_warning_naming_it(cache_dir, next_process, edit, keep_verdict):
    from diffusers_ascend.compilation.passes.manager import FusionPassManager

    fusion, form, change, module, inputs = EDITS[edit]
    assert FusionPassManager([fusion]).ensure_verified() is True  # the first process: checks, writes
    path, edited = _edit_file(cache_dir, fusion, form, change)
    if not keep_verdict:
        for v in cache_dir.parent.glob("*.json"):
            v.unlink()
    next_process()
    with pytest.warns(pretraced.PretracedCacheWarning, match=re.escape(str(path))):
        # the edited graph is never read: the form fuses, its look-alike does not (eager's numbers)
        _compiles(fusion, module(edited=False), inputs(), expected=1)
    _compiles(fusion, module(edited=True), inputs(), expected=0)
    assert path.read_text() != edited  # traced again and written anew, with its digest
    with warnings.catch_warnings():
        warnings.simplefilter("error", pretraced.PretracedCacheWarning)
        assert form in " ".join(pretraced.load(get_pass_class(fusion)))


@pytest.mark.parametrize("edit", list(EDITS))
def test_a_self_check_failing_on_cached_graphs_retraces_instead_of_blaming_torch(cache_dir, next_process, edit):
    from diffusers_ascend.compilation.passes.manager import FusionPassManager

    fusion, form, change, module, inputs = EDITS[edit]
    assert FusionPassManager([fusion]).ensure_verified() is True
    for v in cache_dir.parent.glob("*.json"):  # no verdict: the next process checks
        v.unlink()
    path, edited = _edit_file(cache_dir, fusion, form, change, forge_digest=True)
    next_process()
    with pytest.warns(pretraced.PretracedCacheWarning, match=re.escape(str(path)) + ".*self-check failed"):
        assert FusionPassManager([fusion]).ensure_verified() is True  # no TorchCompatError
    assert path.read_text() != edited
    _compiles(fusion, module(edited=False), inputs(), expected=1)
    _compiles(fusion, module(edited=True), inputs(), expected=0)


@pytest.mark.parametrize("edit", list(EDITS))
def test_a_believed_edited_graph_still_fuses_no_look_alike(cache_dir, next_process, edit):
    # Digest forged and verdict present: nothing checks the file, and the forms matched without
    # Inductor's re-trace take the pattern as read. The match-time check against the search function
    # (`FusionPattern.literal_mismatch`) refuses the look-alike; the true form is not found either
    # (its structure is not the edited pattern's): slower, never wrong.
    from diffusers_ascend.compilation.passes.manager import FusionPassManager

    fusion, form, change, module, inputs = EDITS[edit]
    assert FusionPassManager([fusion]).ensure_verified() is True
    _edit_file(cache_dir, fusion, form, change, forge_digest=True)
    next_process()
    _compiles(fusion, module(edited=True), inputs(), expected=0)
    _compiles(fusion, module(edited=False), inputs(), expected=0)


def test_a_fresh_trace_that_fails_still_blames_torch(cache_dir, next_process, monkeypatch):
    from diffusers_ascend.compilation import _compat
    from diffusers_ascend.compilation.passes.manager import FusionPassManager

    assert FusionPassManager(["adaln"]).ensure_verified() is True
    (path,) = cache_dir.glob("*.json")
    for v in cache_dir.parent.glob("*.json"):
        v.unlink()
    # a torch whose matcher accepts every registration and never fires: cached or fresh alike
    monkeypatch.setattr(_compat, "register_replacement", lambda *a, **k: None)
    next_process()
    with pytest.raises(_compat.TorchCompatError, match=r"replaced its own form 0 times"):
        FusionPassManager(["adaln"]).ensure_verified()
