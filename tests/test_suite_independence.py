"""The suite's results do not depend on where, or by whom, it is run.

Each test runs in an empty folder of its own (a file a documented example writes in the
current folder, `perf/baseline.json`, reaches no other test); the user's config, caches and
ADVISOR_* settings are never read; the suite collects from any folder; and without the public
traces beside the repository their cases show as one named skip, not as nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, USER_SETTINGS

# The files that once imported the test helpers as `tests.conftest`, which only resolves from
# the repository root.
ONCE_ROOT_ONLY = ["test_promise_invariants.py", "test_autocast.py", "test_whatif.py", "test_promise_optimizer_batch.py", "test_diff.py"]


def test_a_test_runs_in_an_empty_folder_of_its_own_outside_the_repository():
    here = Path.cwd().resolve()
    assert here != REPO and REPO not in here.parents, here
    assert list(here.iterdir()) == []
    # what the README's gate example leaves in the current folder (issue: the next test read it)
    (here / "perf").mkdir()
    (here / "perf" / "baseline.json").write_text("{}")


def test_the_next_test_does_not_see_what_the_last_one_left():
    assert not (Path.cwd() / "perf").exists()


@pytest.mark.repo_cwd
def test_a_test_may_ask_for_the_repository_root():
    assert Path.cwd().resolve() == REPO


def test_the_users_config_and_caches_are_not_read():
    from advisor.config import find_config_file, user_config_path

    import pwd

    home = Path.home().resolve()
    assert home != Path(pwd.getpwuid(os.getuid()).pw_dir).resolve()
    for name in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "ADVISOR_CACHE"):
        assert os.environ[name].startswith(str(home.parent)), (name, os.environ[name])
    assert str(user_config_path()).startswith(os.environ["XDG_CONFIG_HOME"])
    assert find_config_file() is None  # no advisor.toml or [tool.advisor] above the test's folder
    assert not [name for name in USER_SETTINGS if name in os.environ]


def test_the_suite_collects_from_another_folder(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *(str(REPO / "tests" / f) for f in ONCE_ROOT_ONLY)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=240,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "error" not in r.stdout.lower().splitlines()[-1], r.stdout[-500:]


def test_no_test_imports_the_suite_as_a_package_of_the_repository():
    """`tests.conftest` resolves only where the repository root is on the path (and loads the
    helpers a second time, beside pytest's own `conftest`): helpers are imported as `conftest`."""
    import ast

    wrong = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            wrong += [f"{path.relative_to(REPO)}: {n}" for n in names if n == "tests" or n.startswith("tests.")]
    assert not wrong, wrong


def test_without_the_public_traces_their_cases_are_one_named_skip(monkeypatch, tmp_path):
    import corpus

    monkeypatch.setattr(corpus, "SHARED_TRACES", tmp_path / "absent" / "traces")
    assert corpus.public_traces() == [corpus.PUBLIC_ABSENT]
    with pytest.raises(pytest.skip.Exception, match="public traces are not available: .*absent"):
        corpus.resolve(corpus.PUBLIC_ABSENT)
