"""Benchmark `blocks`: full-width Flux blocks, eager vs Inductor vs our fusions with the Triton kernels.

    diffusers-ascend bench blocks --out benchmarks/results/   # CUDA, bf16, full width
    diffusers-ascend bench blocks --tiny                      # smoke run on CPU (tiny widths, fp32)

One `FluxTransformerBlock` (double stream) and one `FluxSingleTransformerBlock` at Flux.1 width
(3072, 24 heads of 128) with 4096 image + 512 text tokens (1024x1024), random weights, bf16.
Variants: eager; ``torch.compile(block)`` (Inductor, default mode); ``AscendBackend(fusions="auto",
executor="inductor")``; and each Triton-backed fusion alone, then all four, under the inductor
executor with the ``triton`` provider chosen (``use_providers``). The executor binds each such
node to the kernel's ``triton_op`` (`diffusers_ascend.compilation.backend.bind_compiler_ops`), so
Inductor's code launches the kernel itself. A Triton kernel is still opaque to Inductor's fusion,
so the kernel benchmark (`bench_kernels`) can show a kernel faster than Inductor's code for its
composite while the block gets slower: a fusion belongs in ``fusions="auto"`` on CUDA only if its
row here is no slower than ``inductor``.

``--tiny`` runs the same variants on CPU at tiny widths; there every fused op runs its native
provider (column ``providers``). Column ``ops launched by Inductor`` counts the fused ops bound to
their kernel's ``triton_op``. A variant that fails is reported in its row (``error``) and on
stderr, the others still run, and the command exits 1.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

from ._common import error_line, machine_info, register_ops, stats, text_table, time_ms, write_json

FULL = dict(dim_head=128, heads=24, img=4096, txt=512, axes_dim=(16, 56, 56))


def _variants(device_type: str) -> dict[str, tuple[Any, dict[str, str], bool]]:
    """name -> (fusions for AscendBackend, or None for eager, "inductor" for torch.compile, or
    "inductor_cudagraphs" for its mode="reduce-overhead"; provider choice; graph capture)."""
    from diffusers_ascend.fusions import FUSION_TO_OP, triton_fusions

    TRITON_FUSIONS = triton_fusions()

    on_cuda = device_type == "cuda"

    def choice(fusions):
        return {FUSION_TO_OP[f]: "triton" for f in fusions} if on_cuda else {}

    variants: dict[str, tuple[Any, dict[str, str], bool]] = {
        "eager": (None, {}, False),
        "inductor": ("inductor", {}, False),
        "ascend_auto": ("auto", {}, False),
    }
    for f in TRITON_FUSIONS:
        variants[f"triton_{f}"] = ([f], choice([f]), False)
    variants["triton_all4"] = (list(TRITON_FUSIONS), choice(TRITON_FUSIONS), False)
    if on_cuda:
        # Under capture the host cost of launching (Triton's launcher, the op's dispatch) is gone:
        # these rows compare device time, against Inductor's own CUDA graphs.
        variants["inductor_cudagraphs"] = ("inductor_cudagraphs", {}, False)
        variants["ascend_auto_capture"] = ("auto", {}, True)
        for f in ("rope", "adaln"):
            variants[f"triton_{f}_capture"] = ([f], choice([f]), True)
        variants["triton_all4_capture"] = (list(TRITON_FUSIONS), choice(TRITON_FUSIONS), True)
    return variants


def _inputs(img: int, txt: int, dim: int, axes_dim: Sequence[int], dtype, device) -> dict[str, Any]:
    from diffusers_ascend.tiny import flux_block_inputs

    side = int(img**0.5)
    inputs = flux_block_inputs(txt_len=txt, height=side, width=side, dim=dim, dtype=dtype, axes_dim=tuple(axes_dim))
    return {k: tuple(t.to(device) for t in v) if isinstance(v, tuple) else v.to(device) for k, v in inputs.items()}


def _as_tuple(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _measure(
    block,
    inputs: dict[str, Any],
    ref,
    fusions,
    providers: dict[str, str],
    capture: bool,
    device: str,
    warmup: int,
    runs: int,
) -> dict[str, Any]:
    """Compiles ``block`` as one variant, checks it against eager and times it."""
    import torch

    from ascend_kernels.registry import use_providers
    from diffusers_ascend.compilation import AscendBackend

    backend = None
    if fusions is None:
        fn = block
    elif fusions == "inductor":
        fn = torch.compile(block)
    elif fusions == "inductor_cudagraphs":
        fn = torch.compile(block, mode="reduce-overhead")
    else:
        backend = AscendBackend(
            fusions=fusions,
            executor="inductor",
            on_error="raise",
            graph_capture="graph_with_compile" if capture else None,
        )
        fn = torch.compile(block, backend=backend)
    with torch.no_grad(), use_providers(**providers):
        call = fn
        if fusions == "inductor_cudagraphs":  # its outputs live in the graph's pool until the next step

            def call(**kw):
                torch.compiler.cudagraph_mark_step_begin()
                return fn(**kw)

        t0 = time.perf_counter()
        out = call(**inputs)
        first_s = time.perf_counter() - t0
        diff = max(float((o.float() - r.float()).abs().max()) for o, r in zip(_as_tuple(out), _as_tuple(ref)))
        times = time_ms(lambda: call(**inputs), runs, warmup, device)
    graphs = backend.report.graphs if backend else []
    return dict(
        **stats(times),
        first_call_s=first_s,
        matches=dict(backend.report.matches) if backend else None,
        max_abs_diff=diff,
        # fused ops Inductor launches itself (`bind_compiler_ops`; on_error="raise": a failure raises)
        triton_ops=sum(len(g.bound_providers or {}) for g in graphs) if backend else None,
    )


def run(tiny: bool = False, variants: Sequence[str] | None = None) -> dict[str, Any]:
    """Every variant (or those named; eager always) on both blocks; see the module docstring."""
    import torch
    from diffusers.models.transformers.transformer_flux import FluxSingleTransformerBlock, FluxTransformerBlock

    register_ops()
    device_type = "cpu" if tiny else "cuda"
    dtype = torch.float32 if tiny else torch.bfloat16
    cfg = dict(dim_head=16, heads=2, img=16, txt=8, axes_dim=(4, 4, 8)) if tiny else FULL
    dim = cfg["dim_head"] * cfg["heads"]
    warmup, runs = (3, 10) if tiny else (5, 30)
    inputs = _inputs(cfg["img"], cfg["txt"], dim, cfg["axes_dim"], dtype, device_type)
    chosen = _variants(device_type)
    names = [n for n in chosen if not variants or n in variants or n == "eager"]
    rows = []
    for block_name, cls in (("flux_double", FluxTransformerBlock), ("flux_single", FluxSingleTransformerBlock)):
        torch.manual_seed(0)
        block = cls(dim=dim, num_attention_heads=cfg["heads"], attention_head_dim=cfg["dim_head"])
        block = block.to(device_type, dtype).eval()
        with torch.no_grad():
            ref = block(**inputs)
        eager_ms = None
        for name in names:
            fusions, providers, capture = chosen[name]
            torch.compiler.reset()
            try:
                row = _measure(block, inputs, ref, fusions, providers, capture, device_type, warmup, runs)
            except Exception as e:  # noqa: BLE001  (reported in the row; the command exits 1)
                row = dict(median_ms=None, error=error_line(e))
            eager_ms = row["median_ms"] if name == "eager" else eager_ms
            rows.append(
                dict(
                    block=block_name,
                    variant=name,
                    providers=",".join(sorted(set(providers.values()))) or "-",
                    vs_eager=row["median_ms"] / eager_ms if eager_ms and row["median_ms"] else None,
                    **row,
                )
            )
        inductor = next((r["median_ms"] for r in rows if r["block"] == block_name and r["variant"] == "inductor"), None)
        for r in rows:
            if r["block"] == block_name:
                r["vs_inductor"] = r["median_ms"] / inductor if inductor and r["median_ms"] else None
        del block
        torch.compiler.reset()
    device = torch.cuda.get_device_name(0) if device_type == "cuda" else "cpu"
    return dict(
        benchmark="blocks",
        size="tiny" if tiny else "full",
        dtype=str(dtype).replace("torch.", ""),
        config=cfg,
        device=device,
        machine=machine_info(device_type),
        rows=rows,
    )


COLUMNS = [
    ("block", "block"),
    ("variant", "variant"),
    ("providers", "providers"),
    ("median_ms", "median ms"),
    ("min_ms", "min ms"),
    ("vs_eager", "vs eager"),
    ("vs_inductor", "vs inductor"),
    ("first_call_s", "first call s"),
    ("max_abs_diff", "max |diff| vs eager"),
    ("triton_ops", "ops launched by Inductor"),
]


def cli(args) -> int:
    """``diffusers-ascend bench blocks``: 0 when every variant ran, 1 when one failed, 2 without a GPU."""
    import torch

    if not args.tiny and not torch.cuda.is_available():
        print(
            "bench blocks measures full-width Flux blocks on a CUDA GPU and none is available here "
            "(torch.cuda.is_available() is False); use --tiny for a CPU smoke run.",
            file=sys.stderr,
        )
        return 2
    result = run(tiny=args.tiny, variants=args.variant)
    print(f"{result['device']}, {result['dtype']}, {result['config']}")
    print(text_table(result["rows"], COLUMNS))
    for r in result["rows"]:
        if r.get("matches"):
            print(f"  {r['block']:<12} {r['variant']:<18} matches {r['matches']}")
    write_json(result, args.out, f"blocks{'-tiny' if args.tiny else ''}.json")
    failed = [r for r in result["rows"] if r.get("error")]
    for r in failed:
        print(f"FAILED {r['block']} {r['variant']}: {r['error']}", file=sys.stderr)
    return 1 if failed else 0
