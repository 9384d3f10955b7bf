"""Importing ascend_kernels registers every op and stays light (no diffusers, no Inductor, no
torch_npu/triton), checked in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

import ascend_kernels


def test_import_is_light_and_registers_every_op():
    code = (
        "import json, sys, torch, ascend_kernels\n"
        "ops = [str(getattr(torch.ops.ascend_kernels, n)) for n in ascend_kernels.OPS]\n"
        "heavy = [m for m in ('diffusers', 'torch._inductor', 'torch_npu', 'triton', 'transformers') if m in sys.modules]\n"
        "print(json.dumps({'ops': ops, 'heavy': heavy}))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    info = json.loads(res.stdout.strip().splitlines()[-1])
    assert info["heavy"] == []
    assert info["ops"] == [f"ascend_kernels.{n}" for n in ascend_kernels.OPS]


def test_ops_and_backward_ops_registered():
    for name in ascend_kernels.OPS:
        assert hasattr(torch.ops.ascend_kernels, name)
        assert hasattr(torch.ops.ascend_kernels, f"{name}_backward")
