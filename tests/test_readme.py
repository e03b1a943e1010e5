"""The README shows what the advisor prints: its sample output comes from the command it names,
run on the recorded sample in the repository."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

from conftest import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")


def test_sample_output_is_what_the_command_prints():
    block = re.search(r"```\n\$ (advisor [^\n]+)\n(.*?)```", README, re.S)
    assert block is not None, "no sample output block"
    command, shown = shlex.split(block.group(1)), block.group(2).splitlines()
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}  # as in a pipe: no wrapping
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    r = subprocess.run([sys.executable, "-m", *command], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    printed = [line.rstrip() for line in r.stdout.splitlines()]
    # the shown lines appear in the output, in order ("..." stands for lines left out)
    at = 0
    for line in shown:
        if line == "...":
            continue
        assert line in printed[at:], f"README shows a line the command does not print after line {at}: {line!r}"
        at = printed.index(line, at) + 1
    assert len([line for line in shown if line != "..."]) >= 4
