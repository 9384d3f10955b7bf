"""Blocks of one class share their attention processors under compile="blocks" where dynamo would
otherwise compile every block instance on its own (torch < 2.8, `compiled_blocks_share_graphs`),
only where the processors are interchangeable, and disable gives every block its own back."""

from __future__ import annotations

import enum

import pytest
import torch

import diffusers_ascend
from diffusers_ascend.compilation import _compat
from diffusers_ascend.processors import share_processors, unshare_processors
from diffusers_ascend.tiny import flux_model_inputs, tiny_flux_transformer, tiny_wan_transformer, wan_model_inputs


def _ids(blocks, attr="attn1"):
    return [id(getattr(b, attr).processor) for b in blocks]


def test_shares_one_processor_per_block_position_and_gives_them_back():
    model = tiny_wan_transformer(num_layers=3)
    own1, own2 = _ids(model.blocks), _ids(model.blocks, "attn2")
    undo = share_processors(model.blocks)
    assert len(undo) == 4  # attn1 and attn2 of blocks 1 and 2
    assert _ids(model.blocks) == [own1[0]] * 3 and _ids(model.blocks, "attn2") == [own2[0]] * 3
    assert own1[0] != own2[0]  # positions are not merged
    unshare_processors(undo)
    assert _ids(model.blocks) == own1 and _ids(model.blocks, "attn2") == own2


class _Backend(enum.Enum):
    NATIVE = "native"


def test_only_interchangeable_processors_are_shared():
    model = tiny_wan_transformer(num_layers=6)
    blocks = model.blocks
    plain = type(blocks[0].attn1.processor)

    class Configured(plain):
        flag = None  # declared by the class: configuration, like diffusers' _attention_backend

    class Other(Configured):
        pass

    class Store(plain):
        def __init__(self):
            self.probs = None  # only the instance has it: per-block data __call__ may fill in

    for i, flag in enumerate([(True, 3, _Backend.NATIVE)] * 2 + [(False, 3, _Backend.NATIVE)]):
        blocks[i].attn1.processor = Configured()
        blocks[i].attn1.processor.flag = flag  # blocks 0, 1 equal; block 2 another value
    blocks[3].attn1.processor = Other()  # another class
    blocks[3].attn1.processor.flag = (True, 3, _Backend.NATIVE)
    blocks[4].attn1.processor = Configured()
    blocks[4].attn1.processor.flag = torch.ones(1)  # not plain data: a tensor may differ per block
    for b in blocks:
        b.attn2.processor = Store()
    blocks[5].attn1.processor = torch.nn.Identity()  # a processor with weights is a module
    own, own2 = _ids(blocks), _ids(blocks, "attn2")
    undo = share_processors(blocks)
    assert _ids(blocks) == [own[0], own[0], own[2], own[3], own[4], own[5]]
    assert _ids(blocks, "attn2") == own2
    assert [u[0] for u in undo] == [blocks[1].attn1]


def test_a_processor_set_after_sharing_is_kept():
    model = tiny_wan_transformer(num_layers=2)
    undo = share_processors(model.blocks)
    mine = type(model.blocks[1].attn1.processor)()
    model.blocks[1].attn1.processor = mine
    unshare_processors(undo)
    assert model.blocks[1].attn1.processor is mine  # the user's choice, not our undo
    assert model.blocks[1].attn2.processor is not model.blocks[0].attn2.processor


@pytest.mark.parametrize("share_graphs", [False, True], ids=["torch<2.8", "torch>=2.8"])
def test_enable_shares_only_where_dynamo_guards_on_the_processor(monkeypatch, share_graphs):
    # Pinned to each branch, so the decision is tested whatever torch runs this.
    monkeypatch.setattr(_compat, "compiled_blocks_share_graphs", lambda: share_graphs)
    model = tiny_wan_transformer(num_layers=3)
    own = _ids(model.blocks)
    diffusers_ascend.enable_ascend_compile(model, fusions="all", executor="eager")
    assert len(set(_ids(model.blocks))) == (3 if share_graphs else 1)
    assert len(model._ascend_state.shared) == (0 if share_graphs else 4)
    diffusers_ascend.disable_ascend_compile(model)
    assert _ids(model.blocks) == own


def test_enable_compiles_one_graph_per_block_class_on_this_torch():
    # On every torch of the matrix (torch 2.6 and 2.7 through the shared processors): Wan's blocks
    # one graph, Flux's double blocks one, its single blocks two (the first block's input is
    # contiguous, the others a strided slice). Same output as eager, and disable restores it exactly.
    torch._dynamo.reset()
    for build, make_inputs, expect in (
        (lambda: tiny_wan_transformer(num_layers=3), lambda: wan_model_inputs(2, 4, 4), 1),
        (lambda: tiny_flux_transformer(num_layers=3, num_single_layers=3), lambda: flux_model_inputs(4, 4), 3),
    ):
        model = build()
        inputs = make_inputs()
        with torch.no_grad():
            ref = model(**inputs)[0]
            diffusers_ascend.enable_ascend_compile(model, fusions="all", executor="eager")
            out = model(**inputs)[0]
            report = model._ascend_state.backend.report
            assert report.graphs_compiled == expect, type(model).__name__
            torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
            diffusers_ascend.disable_ascend_compile(model)
            assert torch.equal(model(**inputs)[0], ref)


def test_a_failed_enable_gives_the_processors_back(monkeypatch):
    from diffusers_ascend.integration import api

    monkeypatch.setattr(_compat, "compiled_blocks_share_graphs", lambda: False)
    model = tiny_wan_transformer(num_layers=3)
    own = _ids(model.blocks)
    real, compiled = api.compile_in_place, []

    def second_block_fails(module, *args, **kwargs):
        assert len(set(_ids(model.blocks))) == 1  # shared by now
        if compiled:
            raise RuntimeError("compile setup failed")
        real(module, *args, **kwargs)
        compiled.append(module)

    monkeypatch.setattr(api, "compile_in_place", second_block_fails)
    with pytest.raises(RuntimeError, match="compile setup failed"):
        diffusers_ascend.enable_ascend_compile(model, fusions="all", executor="eager")
    assert compiled and _ids(model.blocks) == own and not hasattr(model, "_ascend_state")
