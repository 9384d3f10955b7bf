"""Zoo sweep for #44 item 6 (partial): each zoo model in fp32 (the zoo's dtype), quantize_(int8 dynamic),
enabled with the int8 fusion only (compile="blocks"): its output against torchao's eager output, the
matches (per compiled graph: blocks of one class share a graph) beside the quantized linears in the blocks.

Run from the repository root: ``python benchmarks/int8_zoo_sweep.py SECONDS OUT.json`` (models past the
time budget are listed as not run). Prints one line per model; a crash of this script's own input
handling shows as ``error`` (it reads the output as the first of a tuple or ``.sample``)."""

import json
import sys
import time

import torch
from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

import diffusers_ascend  # noqa
from diffusers_ascend._diffusers_compat import repeated_blocks
from tests.models.test_zoo import _build
from tests.models.zoo_table import TINY

out = {}
deadline = time.time() + float(sys.argv[1])
for name in sorted(TINY):
    if time.time() > deadline:
        out[name] = "not run (time budget)"
        continue
    t = time.time()
    try:
        torch._dynamo.reset()
        model, inputs = _build(name)
        quantize_(model, Int8DynamicActivationInt8WeightConfig(set_inductor_config=False))
        kinds = repeated_blocks(model)
        in_blocks = sum(
            1
            for m in model.modules()
            if type(m).__name__ in kinds
            for sub in m.modules()
            if type(getattr(sub, "weight", None)).__name__ == "Int8Tensor"
        )
        with torch.no_grad():
            ref = model(**inputs)
        ref = ref[0] if isinstance(ref, (tuple, list)) else getattr(ref, "sample", ref)
        model.enable_ascend_compile(fusions=["int8_dynamic_linear"], executor="eager")
        with torch.no_grad():
            o = model(**inputs)
        o = o[0] if isinstance(o, (tuple, list)) else getattr(o, "sample", o)
        r = model.ascend_report()
        out[name] = dict(
            matches=r.matches["int8_dynamic_linear"],
            linears_in_blocks=in_blocks,
            graphs=r.graphs_compiled,
            fallbacks=len(r.fallbacks),
            bit_equal=bool(torch.equal(o, ref)),
            max_diff=float((o.float() - ref.float()).abs().max()),
            s=round(time.time() - t, 1),
        )
    except Exception as e:
        out[name] = f"error: {type(e).__name__}: {str(e)[:200]}"
    print(name, out[name], flush=True)
json.dump(out, open(sys.argv[2], "w"), indent=1)
