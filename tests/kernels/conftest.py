"""Helpers of the kernel tests: the diffusers code each op replaces, taken from diffusers itself."""

from __future__ import annotations

import types

import pytest
import torch

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def wan_apply_rotary_emb():
    """Wan's rotary closure, the nested ``apply_rotary_emb`` of ``WanAttnProcessor.__call__``,
    rebuilt from its code object (it is not importable by name)."""
    from diffusers.models.transformers import transformer_wan

    codes = [
        c
        for c in transformer_wan.WanAttnProcessor.__call__.__code__.co_consts
        if isinstance(c, types.CodeType) and c.co_name == "apply_rotary_emb"
    ]
    assert len(codes) == 1, "diffusers' WanAttnProcessor no longer has a nested apply_rotary_emb"
    assert not codes[0].co_freevars, "Wan's apply_rotary_emb closes over variables now: rebuild differently"
    return types.FunctionType(codes[0], vars(transformer_wan), "apply_rotary_emb")


def flux_rope(seq_len: int, axes_dim=(4, 4, 8), seed: int = 0):
    """(cos, sin) of shape (S, D) from diffusers' ``FluxPosEmbed`` for random integer ids."""
    from diffusers.models.transformers.transformer_flux import FluxPosEmbed

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 64, (seq_len, len(axes_dim)), generator=g).float()
    return FluxPosEmbed(theta=10000, axes_dim=list(axes_dim))(ids)


def wan_rope(head_dim: int, frames: int, height: int, width: int):
    """(cos, sin) of shape (1, S, 1, D) from diffusers' ``WanRotaryPosEmbed`` (patch 1x2x2)."""
    from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed

    rope = WanRotaryPosEmbed(attention_head_dim=head_dim, patch_size=(1, 2, 2), max_seq_len=64)
    return rope(torch.zeros(1, 4, frames, 2 * height, 2 * width))


@pytest.fixture(params=DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def dtype(request):
    return request.param
