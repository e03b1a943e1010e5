"""The recording commands the READMEs of the shipped runs show are the commands that made them:
each `advisor profile --out DIR ...` naming a run of the repository matches what that run's
facts file recorded (its window, the script's arguments, OMP_NUM_THREADS, --full)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from conftest import REPO

from advisor.capture.session import CaptureOptions

READMES = [REPO / "sample_runs" / "resnet18_cifar" / "README.md", REPO / "tests" / "data" / "quick_start_load" / "README.md"]


def shown_commands(readme: Path) -> list[list[str]]:
    """Every `advisor profile --out DIR` command in the README's code blocks whose DIR is in
    the repository, as words (continued lines joined, comments left out)."""
    commands = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", readme.read_text(encoding="utf-8"), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line.split("#", 1)[0])
            if "advisor" in words and words[words.index("advisor") + 1 : words.index("advisor") + 2] == ["profile"]:
                out = words[words.index("--out") + 1] if "--out" in words else None
                if out is not None and (REPO / out).is_dir():
                    commands.append(words)
    return commands


def expected(words: list[str]) -> tuple[Path, dict]:
    env = dict(w.split("=", 1) for w in words[: words.index("advisor")])
    args = words[words.index("profile") + 1 :]
    script_args = args[args.index("--") + 1 :] if "--" in args else []
    options = args[: args.index("--")] if "--" in args else args
    defaults = CaptureOptions(out_dir=Path("."))

    def option(name: str, default: int) -> int:
        return int(options[options.index(name) + 1]) if name in options else default

    window = {"wait": option("--wait", defaults.wait), "warmup": option("--warmup", defaults.warmup),
              "active": option("--active", defaults.active), "repeat": option("--repeat", defaults.repeat)}  # fmt: skip
    script = next(o for o in options if o.endswith(".py"))
    return REPO / options[options.index("--out") + 1], {
        "window": window, "script": script, "args": script_args, "omp": env.get("OMP_NUM_THREADS"), "full": "--full" in options,
    }


@pytest.mark.parametrize("readme", READMES, ids=lambda p: str(p.relative_to(REPO)))
def test_each_recording_command_shown_made_the_run_it_names(readme):
    commands = shown_commands(readme)
    assert len(commands) >= 2, readme
    for words in commands:
        run, want = expected(words)
        facts = json.loads((run / "advisor_facts.json").read_text())
        assert facts["window"] == want["window"], (run.name, facts["window"])
        assert Path(facts["argv"][0]).name == Path(want["script"]).name and facts["argv"][1:] == want["args"], run.name
        assert facts["torch_threads"]["omp_num_threads_env"] == want["omp"], run.name
        assert facts["stopped_early"] == (not want["full"]), run.name
