"""An installed wheel must carry the rule files, the HTML report's assets and the license:
build one (without setuptools warnings), install it into a bare folder, and use it from
outside the repository. The tests themselves collect without torch."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from conftest import REPO

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def _sources(dest: Path) -> Path:
    """The files a wheel is built from, copied: building in the clone would leave build/ there."""
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, dest / name)
    for name in ("advisor", "rules"):
        shutil.copytree(REPO / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def test_wheel_ships_the_rules(tmp_path: Path):
    import time

    build_started = time.time()
    wheel_dir = tmp_path / "wheel"
    (tmp_path / "src").mkdir()
    source = _sources(tmp_path / "src")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v", "-w", str(wheel_dir), str(source)],
        check=True,
        capture_output=True,
        text=True,
    )
    # setuptools warns about a license table (deprecated) and data folders missing from `packages`
    build_log = build.stdout + build.stderr
    assert "SetuptoolsDeprecationWarning" not in build_log and "absent from the `packages`" not in build_log, build_log[-3000:]
    wheel = next(wheel_dir.glob("torch_advisor-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        assert {"advisor/render/assets/report.css", "advisor/render/assets/report.js"} <= names
        license_name = next(n for n in names if n.endswith(".dist-info/licenses/LICENSE"))
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        license_text = z.read(license_name).decode()
    spdx = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["license"]
    assert spdx == "BSD-3-Clause" and f"License-Expression: {spdx}" in metadata
    assert license_text.startswith("BSD 3-Clause License") and license_text == (REPO / "LICENSE").read_text()
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)], check=True, capture_output=True)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    code = (
        "import advisor, json\n"
        "from advisor.engine import builtin_rules\n"
        "from advisor.render.html import asset\n"
        "print(json.dumps({'file': advisor.__file__, 'rules': [r.id for r in builtin_rules()], 'css': len(asset('report.css'))}))\n"
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
    assert got["css"] == len((REPO / "advisor" / "render" / "assets" / "report.css").read_text(encoding="utf-8"))
    assert not (REPO / "build").exists() or (REPO / "build").stat().st_mtime < build_started


def test_profile_tests_collect_without_torch(tmp_path: Path):
    # `import torch` fails in this child (as on a machine without it); collecting must not.
    (tmp_path / "without_torch.py").write_text("import sys\nsys.modules['torch'] = None\n")
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "without_torch", "-q", "-p", "no:cacheprovider", "tests/test_profile.py", "-k", "cuda_device"],
        cwd=REPO, env={**__import__("os").environ, "PYTHONPATH": str(tmp_path)}, capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0 and "1 skipped" in r.stdout and "error" not in r.stdout.lower(), r.stdout[-2000:]
