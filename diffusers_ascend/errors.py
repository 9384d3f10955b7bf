"""The warning class and prefix of every warning diffusers-ascend emits.

Every warning we raise is an `AscendWarning` (a `UserWarning`) whose message starts with
``"diffusers-ascend: "``, so a service can filter, log or escalate ours without touching torch's or
diffusers'.

>>> import warnings
>>> from diffusers_ascend.errors import AscendWarning, warn
>>> with warnings.catch_warnings(record=True) as caught:
...     warnings.simplefilter("always", AscendWarning)
...     warn("block 'blocks.0' fell back to eager")
>>> caught[0].category is AscendWarning, str(caught[0].message)
(True, "diffusers-ascend: block 'blocks.0' fell back to eager")
"""

from __future__ import annotations

import warnings

PREFIX = "diffusers-ascend: "


class AscendWarning(UserWarning):
    """Base class of every warning diffusers-ascend emits.

    Filter it like any warning category:

    >>> import warnings
    >>> from diffusers_ascend import AscendWarning
    >>> warnings.filterwarnings("error", category=AscendWarning)  # doctest: +SKIP
    """


def warn(message: str, *, stacklevel: int = 2, category: type[AscendWarning] = AscendWarning) -> None:
    """Emit `message` as an `AscendWarning` with our one prefix.

    Args:
        message: the text; the ``"diffusers-ascend: "`` prefix is added unless already there.
        stacklevel: as for `warnings.warn`, counted from the caller of this function.
        category: `AscendWarning` or a subclass of it (one a caller may filter apart).
    """
    if not (isinstance(category, type) and issubclass(category, AscendWarning)):
        raise TypeError(f"category must be AscendWarning or a subclass of it, not {category!r}")
    if not message.startswith(PREFIX):
        message = PREFIX + message
    warnings.warn(message, category, stacklevel=stacklevel + 1)
