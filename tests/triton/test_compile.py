"""Every kernel launch, planned for the model sizes (meta tensors: no memory, no GPU), compiles to a
cubin for NVIDIA sm_90 (H100) and sm_80 (A100) with Triton's own toolchain (ptxas ships in the
triton wheel). The interpreter accepts code the compiler rejects (types, layouts, constexpr
branches); this catches that. It checks neither numerics (the interpreter tests do) nor speed.
Skipped without triton and under TRITON_INTERPRET=1 (the kernels are interpreter functions then)."""

from __future__ import annotations

import os

import pytest
import torch

# The cases are built at collection (they import the kernel modules, hence triton): skip the module.
pytest.importorskip("triton", reason="needs triton")
pytestmark = [
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="kernels are interpreted under TRITON_INTERPRET=1"),
]

_TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
bf, f32 = torch.bfloat16, torch.float32


def meta(*shape, dtype=bf):
    return torch.empty(*shape, dtype=dtype, device="meta")


def _plans():
    from ascend_kernels.triton.adaln import plan_adaln_modulate
    from ascend_kernels.triton.mul_add import plan_mul_add
    from ascend_kernels.triton.rms_norm import plan_rms_norm
    from ascend_kernels.triton.rope import plan_rope

    flux_q, wan_q = meta(1, 4608, 24, 128), meta(1, 75600, 40, 128)
    flux_h, wan_h = meta(1, 4096, 3072), meta(1, 75600, 5120)
    return {
        "rms_norm_flux_qk": lambda: plan_rms_norm(flux_q, meta(128), 1e-6),
        "rms_norm_wan_qk_fp32_weight": lambda: plan_rms_norm(wan_h, meta(5120, dtype=f32), 1e-6),
        "rms_norm_fp16_no_weight_fp32_out": lambda: plan_rms_norm(meta(8, 77, dtype=torch.float16), None, 1e-6, f32),
        "rope_flux_interleaved": lambda: plan_rope(flux_q, meta(1, 4608, 1, 128, dtype=f32), meta(1, 4608, 1, 128, dtype=f32), "interleaved"),
        "rope_wan_half": lambda: plan_rope(wan_q, meta(1, 75600, 1, 128, dtype=f32), meta(1, 75600, 1, 128, dtype=f32), "half"),
        "adaln_flux": lambda: plan_adaln_modulate(flux_h, meta(1, 3072), meta(1, 3072), 1e-6),
        "adaln_wan_fp32_mod": lambda: plan_adaln_modulate(wan_h, meta(1, 1, 5120, dtype=f32), meta(1, 1, 5120, dtype=f32), 1e-6, None, None, bf),
        "adaln_affine_fp32": lambda: plan_adaln_modulate(meta(3, 5, 77, dtype=f32), meta(3, 77, dtype=f32), meta(3, 77, dtype=f32), 1e-6, meta(77, dtype=f32), meta(77, dtype=f32)),
        "mul_add_flux_gate": lambda: plan_mul_add(meta(1, 1, 3072), flux_h, flux_h),
        "mul_add_wan_mixed": lambda: plan_mul_add(wan_h, meta(1, 1, 5120, dtype=f32), meta(1, 75600, 5120, dtype=f32)),
    }


def _compile(launch, arch: int, specialize: bool = False):
    """``triton.compile`` of the planned launch; ``specialize``: as the JIT specializes a real launch
    (integers equal to 1 become constants; pointers (allocations are 16-byte aligned) and integers
    divisible by 16 carry that divisibility)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = launch.kernel.arg_names
    sig, const, attrs = {}, {}, {}
    for i, (name, value) in enumerate(zip(names, launch.args)):
        if isinstance(value, torch.Tensor):
            sig[name] = "*" + _TYPES[value.dtype]
            if specialize:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            sig[name] = "fp32"
        elif specialize and value == 1:
            sig[name], const[(i,)] = "constexpr", 1
        else:
            sig[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
            if specialize and value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    for name, value in launch.constexprs.items():
        sig[name] = "constexpr"
        const[(names.index(name),)] = value
    assert set(sig) == set(names), "a kernel argument was not planned"
    return triton.compile(ASTSource(fn=launch.kernel, signature=sig, constexprs=const, attrs=attrs),
                          target=GPUTarget("cuda", arch, 32), options={"num_warps": launch.num_warps, "enable_fp_fusion": True})


@pytest.mark.parametrize("arch", [90, 80], ids=lambda a: f"sm_{a}")
@pytest.mark.parametrize("case", list(_plans()))
def test_launch_compiles_for_cuda(case, arch):
    out, launch = _plans()[case]()
    assert out.device.type == "meta" and launch.grid[0] <= 65535
    compiled = _compile(launch, arch)
    assert compiled.asm["cubin"], case
    assert compiled.metadata.num_warps == launch.num_warps


@pytest.mark.parametrize("case", [c for c in _plans() if "flux" in c or "wan" in c])
def test_model_size_accesses_are_128_bit(case):
    """At the model sizes every global load and store is a 128-bit vector access (``v4.b32``): the
    in-register pair split of the interleaved rope and the broadcast reads keep rows contiguous.
    A static property of the generated code, not a bandwidth measurement."""
    import re

    _, launch = _plans()[case]()
    ptx = _compile(launch, 90, specialize=True).asm["ptx"]
    accesses = re.findall(r"\b(?:ld|st)\.global(?:\.\w+)*", ptx)
    assert accesses and all(".v4." in a for a in accesses), sorted(set(accesses))


@pytest.mark.parametrize("case", [c for c in _plans() if "flux" in c or "wan" in c])
def test_model_size_kernels_do_not_spill(case, tmp_path):
    """ptxas (the one triton uses for sm_90) reports no register spills at the model sizes: the
    tiles and warps of `_common` fit the register file. Static, not a speed measurement."""
    import re
    import subprocess

    try:
        from triton.backends.nvidia.compiler import get_ptxas

        ptxas = get_ptxas(90).path
    except Exception as e:  # the helper moved between triton releases
        pytest.skip(f"no ptxas path from this triton ({type(e).__name__}: {e})")
    _, launch = _plans()[case]()
    ptx = tmp_path / f"{case}.ptx"
    ptx.write_text(_compile(launch, 90, specialize=True).asm["ptx"])
    res = subprocess.run([ptxas, "-arch=sm_90a", "-v", str(ptx), "-o", str(tmp_path / "out.cubin")],
                         capture_output=True, text=True, check=True)
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", res.stderr)]
    assert spills and not any(spills), res.stderr
