"""Dynamo's process-wide recompile limit, raised while enabled models need it and given back after.

The limit applied is the largest of the holds (weak: a dropped model lets go) and the baseline
found before them. A value someone else set meanwhile becomes the new baseline, and one set after
us is left alone (docs/configuration.md#the-recompile-limit-process-wide).
"""

from __future__ import annotations

import threading
import weakref

from ..enabled import EnabledModel

# Dynamo's own default (``torch._dynamo.config.recompile_limit``): one block class's budget.
DYNAMO_DEFAULT_RECOMPILE_LIMIT = 8

_LIMIT_LOCK = threading.Lock()
_LIMIT_HOLDS: weakref.WeakKeyDictionary[EnabledModel, int] = weakref.WeakKeyDictionary()
_LIMIT: dict[str, int | None] = {"baseline": None, "applied": None}


def _apply_limit(current: int) -> None:
    from ..compilation._compat import set_dynamo_recompile_limit

    target = max([_LIMIT["baseline"], *_LIMIT_HOLDS.values()])
    if target != current:
        set_dynamo_recompile_limit(target)
    _LIMIT["applied"] = target


def hold_recompile_limit(state: EnabledModel, limit: int | None) -> None:
    """Raises dynamo's recompile limit to at least ``limit`` for as long as ``state`` is enabled."""
    from ..compilation._compat import dynamo_recompile_limit

    if limit is None:
        return
    with _LIMIT_LOCK:
        current = dynamo_recompile_limit()
        if _LIMIT["applied"] is None or current != _LIMIT["applied"]:
            _LIMIT["baseline"] = current  # never touched by us, or changed by someone else since
        _LIMIT_HOLDS[state] = limit
        _apply_limit(current)


def release_recompile_limit(state: EnabledModel) -> None:
    """Gives back ``state``'s hold: the limit falls to the largest hold left, or the baseline."""
    from ..compilation._compat import dynamo_recompile_limit

    with _LIMIT_LOCK:
        if _LIMIT_HOLDS.pop(state, None) is None:
            return
        current = dynamo_recompile_limit()
        if current != _LIMIT["applied"]:  # set by someone else after us: leave it
            return
        _apply_limit(current)
