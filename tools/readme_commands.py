#!/usr/bin/env python
"""Prints the README's two commands, read out of README.md, so CI runs what a new user runs.

The commands are the non-comment lines of the first ```` ```bash ```` block after the marker line
``<!-- readme-commands -->`` in README.md: exactly two, the install (it creates ``.venv`` and runs the
demo) and the test run. `.ci/run` runs them with ``eval "$(python3 tools/readme_commands.py N)"``, and
tests/test_readme_commands.py checks that it does, so the README and CI cannot drift apart.

Usage::

    python3 tools/readme_commands.py 1   # the install command
    python3 tools/readme_commands.py 2   # the test command

Only the standard library: CI calls it before anything is installed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
MARKER = "<!-- readme-commands -->"
COUNT = 2


class ReadmeCommandsError(ValueError):
    """README.md does not hold the marked block of exactly two commands."""


def readme_commands(text: str) -> list[str]:
    """The commands of the marked block of a README's text, in order.

    Args:
        text: the README's content.

    Returns:
        The block's lines that are neither blank nor ``#`` comments, stripped; exactly two.

    Raises:
        ReadmeCommandsError: no marker, no ```` ```bash ```` block after it, or not two commands in it.
    """
    lines = text.splitlines()
    if lines.count(MARKER) != 1:
        raise ReadmeCommandsError(f"README.md needs the line {MARKER!r} once, before the two commands' block")
    rest = iter(lines[lines.index(MARKER) + 1 :])
    for line in rest:
        if line.strip() == "```bash":
            break
        if line.strip():
            raise ReadmeCommandsError(f"README.md: the line after {MARKER!r} opens the ```bash block, not {line!r}")
    else:
        raise ReadmeCommandsError(f"README.md: no ```bash block after {MARKER!r}")
    commands = []
    for line in rest:
        if line.strip() == "```":
            break
        if line.strip() and not line.lstrip().startswith("#"):
            commands.append(line.strip())
    else:
        raise ReadmeCommandsError(f"README.md: the ```bash block after {MARKER!r} is never closed")
    if len(commands) != COUNT:
        raise ReadmeCommandsError(f"README.md: the marked block holds {len(commands)} commands, not {COUNT}")
    return commands


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("number", type=int, choices=range(1, COUNT + 1), help="which command: 1 install, 2 tests")
    parser.add_argument("--readme", type=Path, default=README, help=f"the README to read (default {README})")
    args = parser.parse_args(argv)
    try:
        commands = readme_commands(args.readme.read_text(encoding="utf-8"))
    except ReadmeCommandsError as e:
        print(f"readme_commands: {e}", file=sys.stderr)
        return 2
    print(commands[args.number - 1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
