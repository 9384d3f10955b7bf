"""The README's two commands are what CI runs (#41): `.ci/run` reads them out of README.md with
tools/readme_commands.py instead of keeping a copy, and the install keeps PyPI as its index."""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CI = ROOT / ".ci" / "run"
TOOL = ROOT / "tools" / "readme_commands.py"

_spec = importlib.util.spec_from_file_location("readme_commands", TOOL)
rc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rc)


def _code_lines(script: str) -> list[str]:
    """The script's lines without comments and blank lines."""
    return [line.strip() for line in script.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _pip_installs(command: str) -> list[list[str]]:
    """The argument lists of the ``pip install`` calls in a ``&&`` chain."""
    calls = [shlex.split(part) for part in command.split("&&")]
    return [args[2:] for args in calls if args[:2] == ["pip", "install"]]


def test_the_readme_holds_the_two_commands():
    install, tests = rc.readme_commands(README.read_text(encoding="utf-8"))
    steps = [part.strip() for part in install.split("&&")]
    assert steps[:2] == ["python3 -m venv .venv", ". .venv/bin/activate"]  # a fresh venv, used by all that follows
    assert steps[-1] == "diffusers-ascend demo"
    pips = _pip_installs(install)
    assert "torch==2.13.0" in pips[0] and pips[1] == ["-e", ".[test,compose]"]
    assert shlex.split(tests)[:3] == ["python", "-m", "pytest"] and shlex.split(tests)[-1] == "tests"


def test_the_install_keeps_pypi_and_bounds_the_wait_for_pytorchs_index():
    (install, _) = rc.readme_commands(README.read_text(encoding="utf-8"))
    for args in _pip_installs(install):
        # --index-url would replace PyPI: where PyTorch's index is unreachable, nothing installs
        assert "--index-url" not in args and "-i" not in args, args
        if "--extra-index-url" in args:
            assert "--no-deps" in args, "only torch itself should be looked up on PyTorch's index"
            assert int(args[args.index("--timeout") + 1]) <= 15 and int(args[args.index("--retries") + 1]) <= 1


def test_ci_runs_the_readme_commands_read_from_the_readme():
    code = _code_lines(CI.read_text(encoding="utf-8"))
    readme_calls = [line for line in code if "tools/readme_commands.py" in line]
    assert [re.search(r"readme_commands\.py (\d)\)", line).group(1) for line in readme_calls] == ["1", "2"]
    # each is evaluated, as its stage's command, install before tests
    install_var, tests_var = (line.split("=", 1)[0] for line in readme_calls)
    evals = [line for line in code if line.startswith("eval ")]
    assert evals == [f'eval "${install_var}"', f'eval "${tests_var}"']
    assert code.index(readme_calls[0]) < code.index(evals[0]) < code.index(readme_calls[1]) < code.index(evals[1])
    assert code.index("ruff check .") < code.index(evals[0])  # lint stays first
    # and no copy of them is left to drift
    for command in rc.readme_commands(README.read_text(encoding="utf-8")):
        assert not [line for line in code if command in line]
    assert not [line for line in code if re.search(r"pip install[^\n]*\btorch\b|download\.pytorch\.org", line)]
    # the whole suite (tests, no -m/-k selection) runs from the README's command only
    assert not [line for line in code if re.search(r"pytest\b(?!.*\s-[mk]\s).*\stests$", line)]


def test_the_tool_prints_each_command_with_the_standard_library_alone():
    # CI calls it with the system python3 before anything is installed: -I, no site-packages
    commands = rc.readme_commands(README.read_text(encoding="utf-8"))
    for number, command in enumerate(commands, 1):
        out = subprocess.run([sys.executable, "-I", str(TOOL), str(number)], capture_output=True, text=True, check=True)
        assert out.stdout == command + "\n"


_BLOCK = "text\n\n<!-- readme-commands -->\n```bash\n# 1. one\ncmd one\n\n# 2. two\ncmd two\n```\nmore\n"


@pytest.mark.parametrize(
    "text, error",
    [
        (_BLOCK, None),
        (_BLOCK.replace("<!-- readme-commands -->\n", ""), "needs the line"),
        (_BLOCK + "<!-- readme-commands -->\n", "needs the line"),
        (_BLOCK.replace("cmd two\n", ""), "holds 1 commands, not 2"),
        (_BLOCK.replace("cmd two\n", "cmd two\ncmd three\n"), "holds 3 commands, not 2"),
        (_BLOCK.replace("```bash\n", "```\n"), "opens the ```bash block"),
        (_BLOCK.replace("```\nmore", "more"), "never closed"),
    ],
)
def test_the_tool_refuses_a_readme_without_the_marked_two_commands(text, error):
    if error is None:
        assert rc.readme_commands(text) == ["cmd one", "cmd two"]
    else:
        with pytest.raises(rc.ReadmeCommandsError, match=re.escape(error)):
            rc.readme_commands(text)


def test_the_tool_cli_names_the_problem(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text(_BLOCK.replace("cmd two\n", ""))
    assert rc.main(["1", "--readme", str(readme)]) == 2
    assert "holds 1 commands, not 2" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        rc.main(["3"])
    assert "invalid choice: 3 (choose from 1, 2)" in capsys.readouterr().err
