"""An installed wheel must carry the rule files: build one, install it into a bare folder,
and list the rules from outside the repository."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import REPO


def test_wheel_ships_the_rules(tmp_path: Path):
    wheel_dir = tmp_path / "wheel"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheel_dir), str(REPO)],
        check=True,
        capture_output=True,
    )
    wheel = next(wheel_dir.glob("torch_advisor-*.whl"))
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)], check=True, capture_output=True)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    code = (
        "import advisor, json\n"
        "from advisor.engine import builtin_rules\n"
        "print(json.dumps({'file': advisor.__file__, 'rules': [r.id for r in builtin_rules()]}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=outside, env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=True
    )
    import json

    got = json.loads(out.stdout)
    assert got["file"].startswith(str(target)), got["file"]
    in_repo = sorted(p.stem.replace("_", "-") for p in (REPO / "rules").glob("*.py") if not p.name.startswith("_"))
    assert sorted(got["rules"]) == in_repo
    assert "dataloader-stall" in got["rules"]
