"""Recompilation: one shared backend over many identical blocks compiles once per block class;
sequence-length changes under the default `dynamic` stop recompiling once the dynamic graph exists."""

from __future__ import annotations

import torch

from diffusers_ascend.compilation import AscendBackend
from diffusers_ascend.compilation._compat import compiled_blocks_share_graphs
from diffusers_ascend.tiny import flux_block_inputs, tiny_flux_blocks, tiny_flux_transformer, tiny_wan_transformer
from diffusers_ascend.tiny import flux_model_inputs as _flux_inputs
from diffusers_ascend.tiny import wan_model_inputs as _wan_inputs

from .conftest import EXPECTED_BLOCK_COUNTS


def test_shared_backend_compiles_once_per_block_class_wan():
    model = tiny_wan_transformer(num_layers=4)
    backend = AscendBackend(fusions="all", executor="eager")
    model.compile_repeated_blocks(backend=backend, fullgraph=True)
    with torch.no_grad():
        out = model(**_wan_inputs(2, 4, 4))[0]
    graphs = 1 if compiled_blocks_share_graphs() else 4  # 4 blocks, one graph (torch < 2.8: one each)
    assert backend.report.graphs_compiled == graphs
    assert backend.report.matches == {f: graphs * n for f, n in EXPECTED_BLOCK_COUNTS["wan"].items()}
    model.compile_repeated_blocks  # noqa: B018 - compiled in place: state dict keys unchanged
    assert not any("_orig_mod" in k for k in model.state_dict())
    assert torch.isfinite(out).all()


def test_shared_backend_flux_double_and_single_blocks():
    model = tiny_flux_transformer(num_layers=3, num_single_layers=3)
    backend = AscendBackend(fusions="all", executor="eager")
    model.compile_repeated_blocks(backend=backend, fullgraph=True)
    with torch.no_grad():
        model(**_flux_inputs(4, 4))
    # 1 graph for the 3 double blocks; 2 for the single blocks: the first one gets a contiguous
    # input, the others a strided slice (one stride-guard recompile, independent of depth).
    # torch < 2.8 compiles each block instance on its own: 3 + 3.
    n_double, n_single = (1, 2) if compiled_blocks_share_graphs() else (3, 3)
    report = backend.report
    assert report.graphs_compiled == n_double + n_single
    double, single = EXPECTED_BLOCK_COUNTS["flux_double"], EXPECTED_BLOCK_COUNTS["flux_single"]
    assert report.matches == {f: n_double * double[f] + n_single * single[f] for f in double}


def test_a_backend_per_block_recompiles_per_block():
    # The reason to share one backend: dynamo guards on the backend's identity.
    _, single = tiny_flux_blocks()
    inputs = flux_block_inputs()
    backends = [AscendBackend(fusions=["gelu_tanh"], executor="eager") for _ in range(2)]
    with torch.no_grad():
        for b in backends:
            torch.compile(single, backend=b, fullgraph=True)(**inputs)
            torch.compile(single, backend=b, fullgraph=True)(**inputs)  # same backend: cached
    assert [b.report.graphs_compiled for b in backends] == [1, 1]
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 2


def test_sequence_length_changes_stop_recompiling_wan():
    model = tiny_wan_transformer(num_layers=2)
    backend = AscendBackend(fusions="all", executor="eager")
    model.compile_repeated_blocks(backend=backend, fullgraph=True)  # dynamic=None: automatic dynamic
    with torch.no_grad():
        for shape in [(2, 4, 4), (2, 4, 6), (2, 6, 6)]:
            model(**_wan_inputs(*shape))
        warm = backend.report.graphs_compiled
        assert backend.report.graphs[-1]["dynamic"]
        for shape in [(3, 8, 6), (2, 6, 10)]:
            model(**_wan_inputs(*shape))
    assert backend.report.graphs_compiled == warm
    # patterns match on symbolic-shape graphs too
    for graph in backend.report.graphs:
        assert graph["matches"] == EXPECTED_BLOCK_COUNTS["wan"]


def test_sequence_length_changes_stop_recompiling_flux_block():
    double, _ = tiny_flux_blocks()
    backend = AscendBackend(fusions="all", executor="eager")
    compiled = torch.compile(double, backend=backend, fullgraph=True)
    with torch.no_grad():
        compiled(**flux_block_inputs(height=4, width=4))
        compiled(**flux_block_inputs(height=4, width=6))  # recompiles once, dynamic
        warm = backend.report.graphs_compiled
        for hw in [(6, 6), (8, 5)]:
            inputs = flux_block_inputs(height=hw[0], width=hw[1])
            out = compiled(**inputs)
            ref = double(**inputs)
            torch.testing.assert_close(out, ref)
    assert warm == 2 and backend.report.graphs_compiled == 2
    assert [g["dynamic"] for g in backend.report.graphs] == [False, True]
    assert backend.report.graphs[1]["matches"] == EXPECTED_BLOCK_COUNTS["flux_double"]


# -- the recompile limit of an enabled model (issue 33) ---------------------------------------------
def test_the_twentieth_config_enabled_compiles_like_the_first():
    """Each config compiles on its own code object: 20 distinct configs enabled in turn on one
    model each compile the block and fuse its sites. On the block class's shared ``forward``
    code, the 9th (Wan's limit: 8) compiled nothing and ran eager with an empty report. The
    model keeps the graphs of its `_KEPT_CONFIGS` latest configs: one enabled again among them
    compiles nothing, an older one compiles again."""
    import diffusers_ascend
    from ascend_kernels.testing import assert_close

    model = tiny_wan_transformer(num_layers=1)
    inputs = _wan_inputs(2, 4, 4)
    with torch.no_grad():
        ref = model(**inputs)[0]

    def enable(i):
        # max_captured_graphs changes nothing without graph_capture: configs equal but for it
        return diffusers_ascend.enable_ascend_compile(
            model, fusions=["adaln"], executor="eager", max_captured_graphs=i + 1
        )

    for i in range(20):
        enable(i)
        with torch.no_grad():
            out = model(**inputs)[0]
        report = model.ascend_report()
        assert (report.graphs_compiled, report.matches, report.fallbacks) == (
            1,
            {"adaln": EXPECTED_BLOCK_COUNTS["wan"]["adaln"]},
            [],
        ), i
        assert_close(out, ref, dtype=torch.float32)
        diffusers_ascend.disable_ascend_compile(model)
    from diffusers_ascend.compilation._compat import compiled_code_entries
    from diffusers_ascend.integration import block_compile

    kept = list(model._ascend_backends.entries.values())
    assert len(kept) == block_compile.KEPT_CONFIGS and [compiled_code_entries(c.code) for c in kept] == [1] * len(kept)
    for i, graphs in ((19, 1), (0, 1)):  # kept: its graph; dropped long ago: compiled again
        enable(i)
        with torch.no_grad():
            model(**inputs)
        assert model.ascend_report().graphs_compiled == graphs
        diffusers_ascend.disable_ascend_compile(model)
    assert compiled_code_entries(kept[0].code) == 0  # the oldest kept config was dropped for config 0: freed


def test_dynamic_false_compiles_at_most_the_recompile_limit_per_model():
    """``dynamic=False`` compiles one graph per shape, until the limit, which counts every graph of
    the model (all its block classes) under one config: tiny Flux with 3 blocks of each of its 2
    classes compiles exactly ``recompile_limit`` graphs over 8 resolutions (dynamo counted per
    block class, per code object: 2x the limit), then runs the new shapes eager, right, and says so."""
    import gc

    from diffusers_ascend.compilation import _compat

    limit = 4
    gc.collect()  # enabled models dropped in reference cycles hold their limit until collected
    with torch._dynamo.config.patch(**{_compat._recompile_limit_name(): 1}):  # below ours: ours applies
        _limit_per_model(limit)


def _limit_per_model(limit):
    import warnings

    import diffusers_ascend
    from ascend_kernels.testing import assert_close
    from diffusers_ascend.compilation import _compat

    model, stock = (tiny_flux_transformer(num_layers=3, num_single_layers=3) for _ in range(2))  # same seed
    diffusers_ascend.enable_ascend_compile(
        model, fusions=["mul_add"], executor="eager", dynamic=False, recompile_limit=limit
    )
    assert _compat.dynamo_recompile_limit() == limit
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for width in range(4, 12):
            inputs = _flux_inputs(4, width)
            with torch.no_grad():
                out, ref = model(**inputs)[0], stock(**inputs)[0]
            assert_close(out, ref, dtype=torch.float32)
        report = model.ascend_report()
    assert report.graphs_compiled == limit
    if _compat.compiled_blocks_share_graphs():
        assert (
            len(report.fallbacks) == 1 and f"reach dynamo's recompile limit ({limit})" in report.fallbacks[0]["reason"]
        )
        assert sum("reach dynamo's recompile limit" in str(w.message) for w in caught) == 1
    else:  # torch < 2.8 counts per block instance: the model-wide "limit reached" entry is not written there
        assert report.fallbacks == [] and not any("reach dynamo's recompile limit" in str(w.message) for w in caught)
    diffusers_ascend.disable_ascend_compile(model)
