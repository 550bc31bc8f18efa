"""Progress bars of the long-running commands (``run``, store rebuild, ``restore``, ``compact``, ``export``).

One rule everywhere: a bar is drawn on stderr when ``--progress`` asks for it, never with
``--no-progress``, and by default only when stderr is a terminal, so pipes, log files and
``materializer export | head`` see nothing of it. Bars are `tqdm <https://tqdm.github.io>`_ bars
(a dependency of the package).
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["NoProgress", "progress_bar", "show_progress"]


def show_progress(progress: bool | None) -> bool:
    """Whether to draw a bar: ``progress`` when it is True or False; None -> stderr is a terminal."""
    if progress is not None:
        return progress
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stderr
        return False


class NoProgress:
    """Stands in for a bar that is not drawn: ``update``, ``set_postfix_str``, ``clear``,
    ``refresh`` and ``close`` do nothing; usable as a context manager."""

    def update(self, n: float = 1) -> None:  # noqa: ARG002 - tqdm's signature
        """Ignore ``n`` units of progress."""

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:  # noqa: ARG002
        """Ignore a status text."""

    def clear(self) -> None:
        """Nothing to clear."""

    def refresh(self) -> None:
        """Nothing to draw."""

    def close(self) -> None:
        """Nothing to close."""

    def __enter__(self) -> "NoProgress":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def progress_bar(progress: bool | None, *, total: float | None, unit: str, desc: str, **kwargs: Any):
    """A tqdm bar on stderr counting ``unit`` up to ``total`` (None: unknown total), or a
    :class:`NoProgress` when :func:`show_progress` says no. Extra ``kwargs`` go to tqdm
    (e.g. ``unit_scale=True`` for bytes)."""
    if not show_progress(progress):
        return NoProgress()
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, desc=desc, file=sys.stderr, dynamic_ncols=True, **kwargs)
