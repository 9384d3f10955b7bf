"""Pre-traced search graphs (`passes/pretraced.py`, issue 36): a process registers the patterns a
process before it traced, with no trace of its own, and gets the same matchers; a file for another
torch build or pattern code, or one that is not exactly what we write, is never read."""

import json

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
