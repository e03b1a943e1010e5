"""Configuration that catches mistakes: `[tool.advisor]` and every rule's options are typed
structures; a misspelt key, an unknown option or rule, or a value of the wrong type ends in
one line naming the file, the key and what was expected, and exit code 2."""

from __future__ import annotations

import json
import textwrap

import pytest
from conftest import SAMPLE_RUNS

from advisor.config import Config, check_rule_options, load_config
from advisor.engine import builtin_rules
from advisor.errors import InputError

CPU_RUN = SAMPLE_RUNS / "resnet18_cifar" / "runs" / "cpu_baseline"  # one finding: dataloader-stall


@pytest.mark.parametrize(
    "pyproject, key, expected",
    [
        ('[tool.advisor]\nignored = ["channels-last"]\n', "[tool.advisor] ignored", "unknown key (did you mean 'ignore'?)"),
        ("[tool.advisor.rules.dataloader-stall]\nmin_shre = 0.1\n", "[tool.advisor.rules.dataloader-stall] min_shre", "did you mean 'min_share'?"),
        ("[tool.advisor.rules.dataloader-stal]\nmin_share = 0.1\n", "[tool.advisor.rules.dataloader-stal]", "unknown rule 'dataloader-stal'"),
        ('[tool.advisor.rules.dataloader-stall]\nmin_share = "10%"\n', "[tool.advisor.rules.dataloader-stall] min_share", "expected a number (float), got a string '10%'"),
        ("[tool.advisor.rules.memory-growth]\nmin_steps = 2.5\n", "[tool.advisor.rules.memory-growth] min_steps", "expected a whole number (int)"),
        ("[tool.advisor.rules.launch-bound]\nmin_kernels_per_step = true\n", "[tool.advisor.rules.launch-bound] min_kernels_per_step", "expected a whole number (int), got true or false"),
        ('[tool.advisor]\nselect = "dataloader-stall"\n', "[tool.advisor] select", "expected a list (array), got a string"),
        ('[tool.advisor]\nignore = ["channels-last", 3]\n', "[tool.advisor] ignore", "expected a string (str) in each item"),
        ("[tool.advisor.rules]\ndataloader-stall = 0.1\n", "[tool.advisor.rules] dataloader-stall", "expected a table of the rule's options"),
        ("[tool.advisor]\ngate = 120\n", "[tool.advisor] gate", "expected a table (object)"),
        ("[tool.advisor.gate]\nmax_step_tme_ms = 120\n", "[tool.advisor.gate]", "max_step_tme_ms is not a gate setting"),
        ('[tool.advisor.gate]\ntolerance = "5%"\n', "[tool.advisor.gate]", "tolerance must be a fraction"),
    ],
)
def test_mistakes_are_one_line_naming_file_key_and_expectation(cli, tmp_path, pyproject, key, expected):
    (tmp_path / "pyproject.toml").write_text(pyproject)
    code, out, err = cli(["report", str(CPU_RUN)], cwd=tmp_path)
    assert code == 2, out + err
    [line] = err.strip().splitlines()
    assert line.startswith(f"advisor: error: {tmp_path / 'pyproject.toml'}: {key}:"), line
    assert expected in line, line


def test_advisor_toml_names_its_own_keys(cli, tmp_path):
    (tmp_path / "advisor.toml").write_text("[rules.dataloader-stall]\nmin_share = []\n")
    code, _, err = cli(["report", str(CPU_RUN), "--format", "json"], cwd=tmp_path)
    assert code == 2
    assert f"{tmp_path / 'advisor.toml'}: [rules.dataloader-stall] min_share: expected a number (float), got a list" in err


@pytest.mark.parametrize("command", [["gate", str(CPU_RUN), "--max-step-time-ms", "1000"], ["baseline", str(CPU_RUN), "-o", "b.json"], ["diff", str(CPU_RUN), str(CPU_RUN)]])
def test_every_command_rejects_a_bad_config(cli, tmp_path, command):
    (tmp_path / "pyproject.toml").write_text("[tool.advisor.rules.dataloader-stall]\nmin_shre = 0.1\n")
    code, _, err = cli(command, cwd=tmp_path)
    assert code == 2 and "min_shre: unknown key" in err, err


def test_a_valid_option_reaches_the_rule_typed(cli, tmp_path):
    # an int written for a float option is a float; at 100% of the step the stall no longer fires
    (tmp_path / "pyproject.toml").write_text("[tool.advisor.rules.dataloader-stall]\nmin_share = 1\n")
    code, out, err = cli(["report", str(CPU_RUN), "--format", "json"], cwd=tmp_path)
    assert code == 0, err
    assert "dataloader-stall" not in {f["rule"] for f in json.loads(out)["findings"]}
    (tmp_path / "pyproject.toml").unlink()
    code, out, _ = cli(["report", str(CPU_RUN), "--format", "json"], cwd=tmp_path)
    assert "dataloader-stall" in {f["rule"] for f in json.loads(out)["findings"]}
    typed = check_rule_options(Config(rule_options={"dataloader-stall": {"min_share": 1}}), builtin_rules())
    assert typed.rule_options == {"dataloader-stall": {"min_share": 1.0}} and isinstance(typed.rule_options["dataloader-stall"]["min_share"], float)


def test_a_user_rule_takes_its_own_options(cli, tmp_path):
    rules = tmp_path / "my_rules"
    rules.mkdir()
    (rules / "always.py").write_text(
        textwrap.dedent(
            '''
            """Fires on every run with a saving of `share` of the step."""
            ID = "always"
            TITLE = "Always"
            DEFAULTS = {"share": 0.01, "label": "x"}

            def check(ctx):
                return ctx.finding(f"always {ctx.options['label']}", ctx.step_ms * ctx.options["share"])
            '''
        )
    )
    (tmp_path / "pyproject.toml").write_text('[tool.advisor.rules.always]\nlabel = "configured"\n')
    code, out, err = cli(["report", str(CPU_RUN), "--format", "json", "--rules", str(rules)], cwd=tmp_path)
    assert code == 0, err
    assert any(f["message"].startswith("always configured") for f in json.loads(out)["findings"])
    (tmp_path / "pyproject.toml").write_text("[tool.advisor.rules.always]\nlabel = 3\n")
    code, _, err = cli(["report", str(CPU_RUN), "--rules", str(rules)], cwd=tmp_path)
    assert code == 2 and "[tool.advisor.rules.always] label: expected a string (str), got a whole number 3" in err


def test_explain_lists_every_option_with_type_and_default(cli, tmp_path):
    names = {bool: "bool", int: "int", float: "float", str: "str"}
    with_options = [r for r in builtin_rules() if r.defaults]
    assert len(with_options) >= 20
    for rule in with_options:
        code, out, err = cli(["explain", rule.id], cwd=tmp_path)
        assert code == 0, err
        options = out.split("## Options", 1)[1]
        for key, default in rule.defaults.items():
            assert f"- `{key}` ({names[type(default)]}, default `{default!r}`)" in options, (rule.id, key)


def test_the_repository_config_is_valid():
    # what the README shows must load: the same keys, the same tables
    config = load_config(start=SAMPLE_RUNS)
    assert isinstance(config, Config)


def test_readme_example_config_is_accepted(tmp_path):
    readme = (SAMPLE_RUNS.parent / "README.md").read_text()
    block = readme.split("```toml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "pyproject.toml").write_text(block)
    config = load_config(tmp_path / "pyproject.toml")
    assert config.ignore == ["channels-last"] and config.rule_options == {"dataloader-stall": {"min_share": 0.10}}
    check_rule_options(config, builtin_rules())
    with pytest.raises(InputError, match="min_shre"):
        (tmp_path / "pyproject.toml").write_text(block.replace("min_share", "min_shre"))
        check_rule_options(load_config(tmp_path / "pyproject.toml"), builtin_rules())


@pytest.mark.parametrize(
    "pyproject, expected",
    [
        ("tool = 5\n", "tool must be a table ([tool.advisor]), got a whole number"),
        ("[tool.advisor]\nselect = " + "[" * 5000 + "]" * 5000 + "\n", "invalid TOML: values nested too deeply"),
        ("[tool.advisor.rules.dataloader-stall]\nmin_share = nan\n", "[tool.advisor.rules.dataloader-stall] min_share: expected a finite number of at least 0, got nan"),
        ("[tool.advisor.rules.dataloader-stall]\nmin_share = inf\n", "[tool.advisor.rules.dataloader-stall] min_share: expected a finite number of at least 0, got inf"),
        ("[tool.advisor.rules.dataloader-stall]\nmin_share = -0.5\n", "[tool.advisor.rules.dataloader-stall] min_share: expected a finite number of at least 0, got -0.5"),
        ("[tool.advisor.gate]\nmax_step_time_ms = inf\n", "[tool.advisor.gate]: max_step_time_ms must be a positive number, got inf"),
        ("[tool.advisor.gate]\nmax_peak_memory = inf\n", "[tool.advisor.gate]: max_peak_memory must be a number of bytes"),
        ("[tool.advisor.gate]\nmin_samples_per_s = nan\n", "[tool.advisor.gate]: min_samples_per_s must be a positive number, got nan"),
    ],
)
def test_configs_that_once_crashed_or_were_taken_are_one_line_exit_2(cli, tmp_path, pyproject, expected):
    """`tool = 5` and a list nested 5,000 deep ended in exit 3 (AttributeError, RecursionError);
    NaN, infinite and negative thresholds and budgets were accepted."""
    (tmp_path / "pyproject.toml").write_text(pyproject)
    code, out, err = cli(["report", str(CPU_RUN)], cwd=tmp_path)
    assert code == 2, out + err
    [line] = err.strip().splitlines()
    assert line.startswith(f"advisor: error: {tmp_path / 'pyproject.toml'}: {expected}"), line


def test_an_infinite_budget_flag_or_budget_file_is_refused(cli, tmp_path):
    code, _, err = cli(["gate", str(CPU_RUN), "--max-step-time-ms", "inf"], cwd=tmp_path)
    assert code == 2 and err.strip() == "advisor: error: command line: max_step_time_ms must be a positive number, got inf", err
    budget = tmp_path / "budget.toml"
    budget.write_text("max_step_time_ms = inf\n")
    code, _, err = cli(["gate", str(CPU_RUN), "--budget", str(budget)], cwd=tmp_path)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "max_step_time_ms must be a positive number" in err, err
    deep = tmp_path / "deep.toml"
    deep.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    code, _, err = cli(["gate", str(CPU_RUN), "--budget", str(deep)], cwd=tmp_path)
    assert code == 2 and err.strip() == f"advisor: error: {deep}: invalid TOML: values nested too deeply", err
