"""What keeps an enabled model from running as configured, recorded once per cause with a warning
and a report fallback entry: another ``torch.compile`` (around the model or on its blocks since),
diffusers hooks that disable dynamo, methods patched into swapped classes, processors a swap keeps,
block classes that match nothing, and dynamo's recompile limit reached."""

from __future__ import annotations

from typing import Any

import torch

from .. import _diffusers_compat as dc
from ..enabled import EnabledModel
from ..errors import warn
from .block_compile import is_ours, unroutable_hooks


class RunMarker:
    """A forward pre-hook on an enabled model that records that the model ran (also when another
    ``torch.compile`` traces it: dynamo replays the attribute write), see `foreign_compiles`."""

    def __init__(self) -> None:
        self.ran = False

    def __call__(self, module, args) -> None:
        self.ran = True


def mark_runs(model: torch.nn.Module, state: EnabledModel) -> None:
    """Hooks a `RunMarker` on `model` (which `remove_run_markers` takes off)."""
    state.marker = RunMarker()
    model.register_forward_pre_hook(state.marker)


def remove_run_markers(model: torch.nn.Module) -> None:
    for key, hook in list(model._forward_pre_hooks.items()):
        if isinstance(hook, RunMarker):
            del model._forward_pre_hooks[key]


def _fallback(module: str, reason: str, lost: dict[str, int] | None = None):
    from ..compilation.report import Fallback  # here, not at import: patching imports this module

    return Fallback(module, reason, lost or {})


def note_once(state: EnabledModel, module: str, reason: str) -> None:
    """A warning and a fallback entry for `module`, unless this one was recorded already."""
    if any(fb.module == module and fb.reason == reason for fb in state.fallbacks):
        return
    warn(f"{module}: {reason}")
    state.fallbacks.append(_fallback(module, reason))


def _prefixed(name: str, what: str) -> str:
    return f"{name + '.' if name else ''}{what}"


def foreign_compiles(model: torch.nn.Module, name: str, state: EnabledModel, outer: bool = False) -> None:
    """Records (once, with a warning) what keeps our compiled blocks from running: a
    ``torch.compile`` the user applied after enabling (``Module.compile()`` /
    ``compile_repeated_blocks()`` on a block replaces its compiled call; on the whole model, under
    ``compile="blocks"``, dynamo traces the blocks into the model's graph with the user's backend),
    the same traced from outside (`outer`: the model runs inside a ``torch.compile(model)``
    wrapper, before or after enabling), or a diffusers hook that runs the block with dynamo
    disabled and does not call the block's forward (MagCache's do: those compile below it), or a method of a swapped class patched after enabling (`layers._patched`)."""
    from ..layers import _patched

    found = []
    if outer and state.config.compile != "none":
        found.append(
            (
                name or type(model).__name__,
                "it runs inside a torch.compile(model) wrapper (OptimizedModule), "
                "whose dynamo traces our compiled blocks into its own graph: our backend compiles nothing (no "
                "graph fusions; layer swaps and attention still apply). Call the unwrapped model (e.g. "
                "pipe.transformer = pipe.transformer._orig_mod), with compile='model' for one graph per model",
            )
        )
    if state.config.compile == "blocks" and model._compiled_call_impl is not None:
        found.append(
            (
                name or type(model).__name__,
                "the whole model was compiled by another torch.compile "
                "(Module.compile()): its backend traces every block, ours never runs; for one compiled graph "
                "per model use enable_ascend_compile(compile='model')",
            )
        )
    # A block that fell back to eager has no compiled call at all: that is not another compile.
    replaced = [m for m in state.compiled if m._compiled_call_impl is not None and not is_ours(m, state)]
    # A block whose hook disables dynamo compiles below it (`block_compile.route_below_hooks`) unless
    # that hook calls something other than the block's forward.
    hooked = [(m, h) for m in state.compiled if m not in replaced for h in unroutable_hooks(m)]
    if hooked:
        found.append(
            (
                _prefixed(name, f"<{type(hooked[0][0]).__name__}>"),
                f"{len({id(m) for m, _ in hooked})} compiled block(s) run eager: diffusers' "
                f"{type(hooked[0][1]).__name__} wraps their forward in torch.compiler.disable and calls "
                "another wrapper, not the block's forward, so nothing can compile below it (no graph, no fusion); "
                "remove the hook (e.g. disable_cache()) to get them back",
            )
        )
    patched: dict[tuple[type, type], list] = {}
    for obj, cls in state.swapped:
        patched.setdefault((cls, type(obj)), []).append(obj)
    for (cls, fused), objs in patched.items():
        patch = _patched(cls, fused)
        if patch is not None:
            found.append(
                (
                    _prefixed(name, f"<{cls.__name__}>"),
                    f"{len(objs)} {cls.__name__} object(s) run our {fused.__name__}, which replaces {patch}, "
                    "patched in after enabling (e.g. cache-dit's async Ulysses): that code never runs on them; "
                    "enable again to keep it (the swap is then left out)",
                )
            )
    if replaced:
        found.append(
            (
                _prefixed(name, f"<{type(replaced[0]).__name__}>"),
                f"{len(replaced)} compiled block(s) were compiled again after enabling (Module.compile() or "
                "compile_repeated_blocks()): that compile replaced ours, which no longer runs on them; "
                "enable_ascend_compile compiles the blocks itself (enable again to restore it)",
            )
        )
    ours = [m for m in state.compiled if is_ours(m, state)]
    if not found and ours and state.marker is not None and state.marker.ran and not state.compiled_ran:
        found.append(
            (
                name or type(model).__name__,
                "it ran, but none of its compiled modules' calls did: another "
                "torch.compile traced it, most likely a torch.compile(model) wrapper (OptimizedModule) around "
                "it, whose dynamo traces the blocks into its own graph with its own backend: our backend "
                "compiles nothing (no graph fusions; layer swaps and attention still apply). Call the model "
                "itself, with compile='model' for one graph per model",
            )
        )
    for module, reason in found:
        note_once(state, module, reason)


def recompile_limit_reached(model: torch.nn.Module, name: str, state: EnabledModel) -> None:
    """Records (once, with a warning) that the model's compiled graphs reached dynamo's recompile
    limit: a call of a shape none of them takes then runs uncompiled, without fusion. Counted on
    the config's own code object (`block_compile.CompiledCall`), where the limit counts every graph of the
    model (2.8+; before, dynamo counts the graphs of each block instance apart)."""
    from ..compilation._compat import compiled_blocks_share_graphs, compiled_code_entries, dynamo_recompile_limit

    if state.compiled_call is None or not compiled_blocks_share_graphs():
        return
    graphs = sum(compiled_code_entries(code) for code in state.compiled_call.codes)
    limit = dynamo_recompile_limit()
    if graphs >= limit:
        note_once(
            state,
            name or type(model).__name__,
            (
                f"{graphs} graphs compiled for this config reach dynamo's recompile limit ({limit}): a call of a new shape "
                "runs uncompiled, without fusion. Use dynamic=None (the default) or True for varying resolutions, or a "
                "higher recompile_limit"
            ),
        )


def foreign_processors(model, adapter, fusions, swapped, skipped) -> list[tuple[str, str, str, str]]:
    """The attention processors left unswapped that a processor swap of `adapter` was written for
    (the module's default processor class is the swap's source), as `apply_swaps`' ``skipped``
    entries: another class there (the user's, cache-dit's) is kept, and its code runs unfused."""
    if adapter is None:
        return []
    swaps = [s for s in adapter.swaps if s.fusion in fusions and not issubclass(s.target(), torch.nn.Module)]
    done = {id(obj) for obj, _ in swapped}
    reported = {n for _, n, _, _ in skipped}
    out = []
    for n, module in model.named_modules():
        proc = module.__dict__.get("processor")
        default = dc.default_processor_class(module)
        swap = next((s for s in swaps if getattr(default, "__name__", None) == s.source), None)
        if swap is None or proc is None or id(proc) in done or f"{n}.processor" in reported:
            continue
        cls = type(proc)
        out.append(
            (
                swap.fusion,
                f"{n}.processor",
                cls.__name__,
                f"{cls.__module__}.{cls.__qualname__} is not diffusers' {swap.source}, which the swap replaces",
            )
        )
    return out


def note_unswapped(
    state: EnabledModel, model: torch.nn.Module, name: str, unswapped: list[tuple[str, str, str, Any]]
) -> None:
    """One warning and fallback entry per (fusion, reason) for the modules a swap left as they were."""
    for fusion, patch in dict.fromkeys((f, p) for f, _, _, p in unswapped):
        mods = [(n, c) for f, n, c, p in unswapped if f == fusion and p == patch]
        if patch is None:
            reason = (
                f"{len(mods)} {mods[0][1]} module(s) not fused by {fusion!r} (first: {mods[0][0] or '<root>'}): "
                "their `forward` is an instance attribute (a hook applied before enabling, e.g. leaf-level group "
                "offloading) that calls the original class's forward. Apply the hook after "
                "enable_ascend_compile, or use block-level offloading."
            )
        else:
            reason = (
                f"{len(mods)} {mods[0][1]} object(s) kept, not fused by the {fusion!r} swap (first: "
                f"{mods[0][0] or '<root>'}): {patch}; the fused class would replace that code"
            )
            if state.config.compile != "none" and fusion == "rope":
                reason += "; the rope graph pass still fuses the rope that code computes (see matches['rope'])"
        warn(f"{name or type(model).__name__}: {reason}")
        state.fallbacks.append(_fallback(_prefixed(name, f"<{fusion} swaps>"), reason, {fusion: len(mods)}))


def note_missing_blocks(state: EnabledModel, model: torch.nn.Module, name: str, adapter, missing: list[str]) -> None:
    """One warning and fallback entry per block class the adapter names that matches no submodule."""
    for block in missing:  # e.g. a `_repeated_blocks` name this config does not build
        reason = (
            f"block class {block!r} named by the {adapter.name!r} adapter matches no submodule of "
            f"{type(model).__name__}: nothing of it is compiled"
        )
        warn(f"{name or type(model).__name__}: {reason}")
        state.fallbacks.append(_fallback(_prefixed(name, f"<{block}>"), reason))
