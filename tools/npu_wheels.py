#!/usr/bin/env python
"""Reads the op contracts out of the torch_npu and MindIE SD wheels into tests/kernels/npu_contracts.json.

The wheels hold the truth about the Ascend stack we call (FINDINGS.md section 10): the op schemas are
strings in ``torch_npu/lib/libtorch_npu.so`` (no yaml or .pyi ships), the op docs are
``torch_npu/_op_plugin_docs.py``, the output shapes ``torch_npu/op_plugin/meta/_meta_registrations.py``,
the SoC enum ``NpuVariables.h``, the Python API the ``torch_npu/npu`` package; MindIE SD's op schemas are
strings in its per-torch ``plugin/torch*/libPTAExtensionOPS.so``. Nothing is imported or executed: the
wheels need CANN and a device to import. The stand-ins (tests/kernels/npu_standins.py) and the binding
test (tests/kernels/test_npu_wheel_bindings.py) read the generated file, offline.

Usage::

    python tools/npu_wheels.py                    # download (cached) + extract + write the contract file
    python tools/npu_wheels.py --check            # download afresh + extract; exit 1 if the committed file differs
    python tools/npu_wheels.py --only torch_npu   # the torch_npu part only (MindIE SD's is kept as committed)

Wheels are cached under ``~/.cache/diffusers-ascend/wheels`` (``--cache`` to change); ``--check``
downloads into a temporary directory so a stale cache cannot hide a changed wheel.
"""

from __future__ import annotations

import argparse
import ast
import glob
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONTRACT = ROOT / "tests" / "kernels" / "npu_contracts.json"
CACHE = Path(os.path.expanduser("~/.cache/diffusers-ascend/wheels"))

# (distribution, version, platform tag): the torch_npu range we support and MindIE SD 3.1.0, which
# ships a manylinux_2_34 wheel only (with a 2_28 filter pip finds nothing but 0.0.1.dev1).
WHEELS = (
    ("torch_npu", "2.10.0.post6", "manylinux_2_28_x86_64"),
    ("torch_npu", "2.14.0", "manylinux_2_28_x86_64"),
    ("mindiesd", "3.1.0", "manylinux_2_34_x86_64"),
)
PYTHON = "3.11"

# torch_npu ops whose contract we keep: what diffusers-ascend calls, and what diffusers calls itself
# when torch_npu is installed (npu_rms_norm, npu_geglu, npu_fusion_attention).
TORCH_NPU_OPS = (
    "npu_rms_norm",
    "npu_add_rms_norm",
    "npu_rotary_mul",
    "npu_gelu",
    "npu_fast_gelu",
    "npu_swiglu",
    "npu_geglu",
    "npu_fused_infer_attention_score",
    "npu_fused_infer_attention_score_v2",
    "npu_fusion_attention",
    # INT8 (#44): the quantized linears' providers and the norm + quant kernels they can absorb.
    "npu_dynamic_quant",
    "npu_quant_matmul",
    "npu_quant_matmul_dequant",
    "npu_quant_matmul_gelu",
    "npu_weight_quant_batchmatmul",
    "npu_add_rms_norm_dynamic_quant",
    "npu_rms_norm_quant_v2",
)
# torch_npu.npu Python API (reached as torch.npu.<name> once torch_npu is imported) that we call.
TORCH_NPU_API = (
    "get_soc_version",
    "get_device_name",
    "is_jit_compile_false",
    "set_compile_mode",
    "is_available",
    "device_count",
    "current_device",
    "synchronize",
    "max_memory_allocated",
    "reset_peak_memory_stats",
    "graph_pool_handle",
    "graph",
    "NPUGraph",
    "Event",
)

_SO_SCHEMA = re.compile(
    rb"(?<![\x21-\x7e])([a-z_][A-Za-z0-9_.]*\((?:[^\x00()]|\([^\x00()]*\))*\)\s*->\s*[^\x00]+?)\x00"
)
_SECTIONS = (
    "接口原型",
    "功能描述",
    "参数说明",
    "输出说明",
    "约束说明",
    "支持的型号",
    "支持的PyTorch版本",
    "示例",
    "调用示例",
)
_PARAM = re.compile(r"^\s*[“\"]?([A-Za-z_][A-Za-z0-9_]*)[”\"]?\s*(?:\([^)]*\)\s*)?[：:\-]\s*(.+)$")
# Product names in the docs -> SoC family (the families are defined by the SocVersion ranges below).
_PRODUCTS = (
    (re.compile(r"Atlas\s*A3\s*(?:训练|推理)"), "A3"),
    (re.compile(r"Atlas\s*(?:800I\s*)?A2\s*(?:训练|推理)"), "A2"),
    (re.compile(r"Atlas\s*200I/500\s*A2"), "310B"),
    (re.compile(r"Atlas\s*训练系列"), "910"),
    (re.compile(r"Atlas\s*推理系列"), "310P"),
)


def download(dist: str, version: str, platform: str, dest: Path) -> Path:
    """``pip download --no-deps`` of one wheel into ``dest`` (skipped when it is already there)."""
    found = sorted(glob.glob(str(dest / f"{dist}-{version}-*.whl")))
    if found:
        return Path(found[0])
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        f"{dist}=={version}",
        "--python-version",
        PYTHON,
        "--platform",
        platform,
        "--only-binary",
        ":all:",
        "-d",
        str(dest),
        "-q",
    ]
    subprocess.run(cmd, check=True)
    found = sorted(glob.glob(str(dest / f"{dist}-{version}-*.whl")))
    if not found:
        raise SystemExit(f"pip downloaded no {dist}=={version} wheel for {platform} into {dest}")
    return Path(found[0])


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _normalize(schema: str) -> str:
    s = re.sub(r"\s+", " ", schema).strip()
    return s.replace("( ", "(").replace(" )", ")")


def so_schemas(blob: bytes) -> dict[str, str]:
    """Every ``name(args) -> returns`` string in a shared library, by op name (overloads keep their
    ``name.overload``); C++ string concatenation leaves runs of spaces, which are folded."""
    out: dict[str, str] = {}
    for m in _SO_SCHEMA.finditer(blob):
        s = _normalize(m.group(1).decode("latin-1"))
        out.setdefault(s.split("(", 1)[0], s)
    return out


def _sections(doc: str) -> dict[str, list[str]]:
    """The doc split at its headers (``参数说明``, ``约束说明``, ...): header -> non-empty lines."""
    out: dict[str, list[str]] = {"": []}
    current = ""
    for line in doc.splitlines():
        stripped = line.strip().strip("\u200b")
        head = stripped.rstrip(":：")
        if head in _SECTIONS:
            current = head
            out.setdefault(current, [])
        elif stripped:
            out[current].append(stripped)
    return out


def products(lines: list[str]) -> list[str]:
    """SoC families named by the product lines of a doc (``Atlas A2 训练系列产品`` -> ``A2``)."""
    fams: list[str] = []
    for line in lines:
        for pat, fam in _PRODUCTS:
            # the A2/A3 patterns also contain "训练系列": drop what a more specific pattern matched
            if pat.search(line) and fam not in fams:
                fams.append(fam)
            line = pat.sub("", line)
    return fams


def doc_contract(doc: str) -> dict:
    """What a torch_npu op doc states: its signature line, per-parameter lines, constraint lines,
    and the SoC families it is documented for, per jit_compile scenario where the doc splits them."""
    secs = _sections(doc)
    sig = next((ln.strip() for ln in doc.splitlines() if re.match(r"\s*torch_npu\.\s*\w+\(.*\)\s*->", ln)), None)
    params: dict[str, str] = {}
    for line in secs.get("参数说明", []):
        m = _PARAM.match(line)
        if m and m.group(1) not in params:
            params[m.group(1)] = m.group(2).strip()
    constraints = secs.get("约束说明", [])
    scenario, by_scenario = "*", {}
    for line in constraints + secs.get("支持的型号", []):
        m = re.match(r"(jit_compile=(?:True|False))场景", line)
        if m:
            scenario = m.group(1)
            continue
        if "Atlas" in line:
            by_scenario.setdefault(scenario, []).append(line)
    return {
        "signature": sig,
        "params": params,
        "constraints": constraints,
        "products": {k: products(v) for k, v in by_scenario.items()},
        "product_lines": by_scenario,
    }


def op_docs(source: str, ops) -> dict[str, dict]:
    """The ``_add_torch_npu_docstr("op", doc)`` calls of ``_op_plugin_docs.py`` (parsed, not imported)."""
    docs = {}
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", None) == "_add_torch_npu_docstr"
            and len(node.args) == 2
            and all(isinstance(a, ast.Constant) for a in node.args)
        ):
            name, doc = node.args[0].value, node.args[1].value
            if name in ops:
                docs[name] = doc_contract(doc)
    return docs


def meta_sources(source: str, ops) -> dict[str, str]:
    """The ``@impl(m, "op")`` meta function of each op, as source text."""
    out = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for dec in node.decorator_list:
            if (
                isinstance(dec, ast.Call)
                and getattr(dec.func, "id", None) == "impl"
                and len(dec.args) == 2
                and isinstance(dec.args[1], ast.Constant)
                and dec.args[1].value in ops
            ):
                node.decorator_list = []
                out[dec.args[1].value] = ast.unparse(node)
    return out


def soc_versions(header: str) -> dict[str, int]:
    """``c10_npu::SocVersion`` (NpuVariables.h): name -> value, with C++'s implicit increments."""
    body = header[header.index("enum class SocVersion") :]
    body = body[body.index("{") + 1 : body.index("}")]
    out, value = {}, -1
    for item in filter(None, (i.strip() for i in body.split(","))):
        name, _, explicit = (p.strip() for p in item.partition("="))
        value = int(explicit) if explicit else value + 1
        out[name] = value
    return out


def soc_families(py_files: dict[str, str]) -> dict[str, list]:
    """SoC family -> [first, end) SocVersion, from the wheel's own SoC detection (``class Soc``:
    ``if soc_version >= 250: return Soc.A3`` ...). Earlier branches bound later ones."""
    pat = re.compile(r"if soc_version >= (\d+)(?: and soc_version < (\d+))?:\s*(?:#[^\n]*)?\n\s*return Soc\.(\w+)")
    for path, text in sorted(py_files.items()):
        if "class Soc(IntEnum)" not in text:
            continue
        fams, upper = {}, None
        for lo, hi, fam in pat.findall(text):
            end = int(hi) if hi else upper
            fams[fam] = [int(lo), end]
            upper = int(lo)
        if fams:
            return {"source": path, **fams}
    raise SystemExit("no SoC family detection (class Soc) found in the wheel")


def _signature(node) -> str | None:
    if isinstance(node, ast.ClassDef):
        init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        if init is None:
            return "(*args, **kwargs)"  # inherits a C++ constructor
        init.args.args = init.args.args[1:]  # drop self
        return f"({ast.unparse(init.args)})"
    return f"({ast.unparse(node.args)})"


def python_api(files: dict[str, str], package: str, names) -> dict[str, dict]:
    """Signatures of ``<package>.<name>`` (a def or class, followed through ``from .x import ...``
    and ``import *`` in the package's ``__init__``), read from the source text."""
    trees: dict[str, ast.Module] = {}

    def tree(mod: str):
        path = mod.replace(".", "/")
        for cand in (f"{path}.py", f"{path}/__init__.py"):
            if cand in files:
                if cand not in trees:
                    trees[cand] = ast.parse(files[cand])
                return cand, trees[cand]
        return None, None

    def find(mod: str, name: str, depth: int = 0):
        path, t = tree(mod)
        if t is None or depth > 4:
            return None
        for node in t.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
                return {"defined_in": path, "signature": _signature(node), "kind": type(node).__name__[:-3].lower()}
        for node in t.body:
            if isinstance(node, ast.ImportFrom) and node.level >= 1:
                base = mod if path.endswith("__init__.py") else mod.rsplit(".", 1)[0]
                for _ in range(node.level - 1):
                    base = base.rsplit(".", 1)[0]
                target = f"{base}.{node.module}" if node.module else base
                for alias in node.names:
                    if alias.name == "*" or (alias.asname or alias.name) == name:
                        hit = find(target, alias.name if alias.name != "*" else name, depth + 1)
                        if hit:
                            return hit
            elif (
                isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(package.split(".")[0] + ".")
            ):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        hit = find(node.module, alias.name, depth + 1)
                        if hit:
                            return hit
        return None

    return {name: find(package, name) for name in names}


def read_torch_npu(wheel: Path) -> dict:
    with zipfile.ZipFile(wheel) as z:
        so = z.read("torch_npu/lib/libtorch_npu.so")
        py = {n: z.read(n).decode("utf-8", "replace") for n in z.namelist() if n.endswith(".py")}
        header = z.read("torch_npu/include/torch_npu/csrc/core/npu/NpuVariables.h").decode()
    schemas = so_schemas(so)
    missing = [op for op in TORCH_NPU_OPS if op not in schemas]
    if missing:
        raise SystemExit(f"{wheel.name}: no schema string for {missing} in libtorch_npu.so")
    libs = sorted(
        {m.decode() for m in re.findall(rb"(?<![\x21-\x7e])(lib(?:cust_opapi|opapi|aclnn_[a-z_]+)\.so)\x00", so)}
    )
    return {
        "wheel": wheel.name,
        "sha256": _sha256(wheel),
        "schemas": {op: schemas[op] for op in TORCH_NPU_OPS},
        "schema_count": len(schemas),
        "docs": op_docs(py["torch_npu/_op_plugin_docs.py"], TORCH_NPU_OPS),
        "meta": meta_sources(py["torch_npu/op_plugin/meta/_meta_registrations.py"], TORCH_NPU_OPS),
        "soc_versions": soc_versions(header),
        "soc_families": soc_families(py),
        # op-api libraries libtorch_npu.so names (its aclnn symbol lookup: cust first, then opapi,
        # then the per-feature libaclnn_*.so); ASCEND_CUSTOM_OPP_PATH entries hold op_api/lib/.
        "aclnn_libraries": libs,
        "aclnn_custom_path_env": "ASCEND_CUSTOM_OPP_PATH" if b"ASCEND_CUSTOM_OPP_PATH\x00" in so else None,
        "python_api": python_api(py, "torch_npu.npu", TORCH_NPU_API),
    }


def read_mindiesd(wheel: Path) -> dict:
    with zipfile.ZipFile(wheel) as z:
        plugins = sorted(
            n for n in z.namelist() if re.fullmatch(r"mindiesd/plugin/(?:torch\d+/)?libPTAExtensionOPS\.so", n)
        )
        per_plugin = {n.split("/")[2] if n.count("/") == 3 else "default": so_schemas(z.read(n)) for n in plugins}
        variants_src = z.read("mindiesd/_torch_variants.py").decode()
        register_src = z.read("mindiesd/layers/register_ops.py").decode()
    variants = next(
        ast.literal_eval(n.value)
        for n in ast.parse(variants_src).body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "SUPPORTED_TORCH_PLUGIN_VARIANTS"
    )
    schemas: dict[str, str] = {}
    differing: dict[str, dict] = {}
    for plugin, found in per_plugin.items():
        for op, s in found.items():
            if schemas.setdefault(op, s) != s:
                differing.setdefault(op, {})[plugin] = s
    unsupported = re.search(r'f"(Unsupported torch version [^"]*)"', register_src)
    return {
        "wheel": wheel.name,
        "sha256": _sha256(wheel),
        "schemas": dict(sorted(schemas.items())),
        "schemas_differing_by_plugin": differing,
        "plugins": sorted(per_plugin),
        "torch_plugin_variants": variants,
        # register_ops.py, at import on an NPU host: a torch major.minor outside the variants raises.
        "unsupported_torch_error": f"RuntimeError: {unsupported.group(1)}" if unsupported else None,
    }


DISTRIBUTIONS = tuple(dict.fromkeys(dist for dist, _, _ in WHEELS))


def build(cache: Path, only: str | None = None, committed: dict | None = None) -> dict:
    """The contract file's content, read from the wheels; with ``only``, that distribution's part
    read from its wheels and every other part taken from ``committed``."""
    out: dict = {"generated_by": "tools/npu_wheels.py", **{dist: {} for dist in DISTRIBUTIONS}}
    if only is not None:
        out.update({dist: part for dist, part in (committed or {}).items() if dist not in ("generated_by", only)})
    for dist, version, platform in WHEELS:
        if only is not None and dist != only:
            continue
        wheel = download(dist, version, platform, cache)
        out[dist][version] = read_torch_npu(wheel) if dist == "torch_npu" else read_mindiesd(wheel)
    return out


def dumps(contract: dict) -> str:
    return json.dumps(contract, indent=1, ensure_ascii=False, sort_keys=True) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="download afresh and fail if the committed file differs")
    parser.add_argument("--cache", type=Path, default=CACHE, help=f"wheel cache (default {CACHE})")
    parser.add_argument("--out", type=Path, default=CONTRACT)
    parser.add_argument(
        "--only",
        choices=DISTRIBUTIONS,
        help="download and read only this distribution's wheels; the other parts are kept as the file has them",
    )
    args = parser.parse_args(argv)
    start = time.perf_counter()
    committed = args.out.read_text() if args.out.exists() else ""
    if args.only and not committed:
        parser.error(
            f"--only {args.only} keeps the other parts of {args.out}, which does not exist: run without --only"
        )
    kept = json.loads(committed) if args.only else None
    if args.check:
        with tempfile.TemporaryDirectory(prefix="npu-wheels-") as tmp:
            text = dumps(build(Path(tmp), args.only, kept))
        took = time.perf_counter() - start
        if text != committed:
            import difflib

            diff = difflib.unified_diff(
                committed.splitlines(), text.splitlines(), str(args.out), "wheels", lineterm="", n=1
            )
            print("\n".join(list(diff)[:200]))
            print(f"{args.out} differs from what the wheels say ({took:.0f}s): run python tools/npu_wheels.py")
            return 1
        print(f"{args.out} matches the wheels ({took:.0f}s)")
        return 0
    args.out.write_text(dumps(build(args.cache, args.only, kept)))
    print(f"wrote {args.out} ({time.perf_counter() - start:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
