"""`tools/npu_wheels.py --only <distribution>` re-reads one distribution's wheels and keeps the rest
of the contract file as it is (#41: a torch_npu change no longer downloads MindIE SD). The wheels are
replaced by recorded stand-ins here: what is checked is which wheels the tool fetches and what it writes."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "npu_wheels.py"


@pytest.fixture
def tool(monkeypatch):
    spec = importlib.util.spec_from_file_location("npu_wheels", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fetched = []

    def download(dist, version, platform, dest):
        fetched.append((dist, version))
        return Path(dest) / f"{dist}-{version}.whl"

    monkeypatch.setattr(module, "download", download)
    monkeypatch.setattr(module, "read_torch_npu", lambda wheel: {"read": wheel.name})
    monkeypatch.setattr(module, "read_mindiesd", lambda wheel: {"read": wheel.name})
    module.fetched = fetched
    return module


def _committed(tool, tmp_path, torch_npu_part):
    contract = {
        "generated_by": "tools/npu_wheels.py",
        "torch_npu": torch_npu_part,
        "mindiesd": {"3.1.0": {"schemas": {"adaln": "as committed"}}},
    }
    out = tmp_path / "npu_contracts.json"
    out.write_text(tool.dumps(contract))
    return out, contract


def test_only_torch_npu_fetches_its_wheels_and_keeps_the_rest(tool, tmp_path):
    out, before = _committed(tool, tmp_path, {"2.9.0": {"stale": True}})
    assert tool.main(["--only", "torch_npu", "--out", str(out), "--cache", str(tmp_path)]) == 0
    torch_npu = [(d, v) for d, v, _ in tool.WHEELS if d == "torch_npu"]
    assert tool.fetched == torch_npu
    after = json.loads(out.read_text())
    assert after["mindiesd"] == before["mindiesd"]
    # the part is rebuilt, not merged: a wheel no longer in WHEELS leaves the file
    assert after["torch_npu"] == {v: {"read": f"torch_npu-{v}.whl"} for _, v in torch_npu}
    assert out.read_text() == tool.dumps(after)


def test_only_with_check_compares_the_whole_file(tool, tmp_path, capsys):
    torch_npu = {v: {"read": f"torch_npu-{v}.whl"} for d, v, _ in tool.WHEELS if d == "torch_npu"}
    out, _ = _committed(tool, tmp_path, torch_npu)
    text = out.read_text()
    assert tool.main(["--only", "torch_npu", "--check", "--out", str(out)]) == 0
    assert "matches the wheels" in capsys.readouterr().out and out.read_text() == text
    assert all(d == "torch_npu" for d, _ in tool.fetched)
    out.write_text(text.replace('"read": "torch_npu-', '"read": "other-'))
    assert tool.main(["--only", "torch_npu", "--check", "--out", str(out)]) == 1


def test_only_refuses_what_it_cannot_do(tool, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        tool.main(["--only", "torch_npu", "--out", str(tmp_path / "missing.json")])
    assert e.value.code == 2 and "does not exist: run without --only" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        tool.main(["--only", "torch"])
    assert "invalid choice: 'torch' (choose from 'torch_npu', 'mindiesd')" in capsys.readouterr().err
    assert tool.fetched == []
