"""`advisor fix` on training loops that live in a library: a Lightning module and a
`transformers` Trainer (a small BERT built from a config, nothing downloaded).

What the user's own file holds (a Lightning module's DataLoader and optimizer) is edited; what
the library does (Lightning's precision and zeroing, everything a Trainer builds from
TrainingArguments) is printed as the library's setting, and site-packages is never touched.
Each fixed script still trains to its end on the CPU, and a second fix changes nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from advisor.analysis import analyze
from advisor.fix import DONE, PLACED, SETTING, plan_fixes
from conftest import SAMPLE_RUNS, shared

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "fix"


def findings(run: Path) -> list[dict]:
    return analyze(run).to_dict()["findings"]


def by_rule(plan) -> dict:
    return {r.rule: r for r in plan.results}


def runs_to_the_end(path: Path, steps: int = 3) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, str(path), "--steps", str(steps)], capture_output=True, text=True, timeout=600, env=env, cwd=path.parent)
    assert done.returncode == 0 and f"done: {steps} steps" in done.stdout, done.stderr[-3000:]


def site_packages_untouched(plan) -> None:
    """Every edit is in the script: the fixed text is the script's, no other file is named."""
    for r in plan.results:
        assert "site-packages" not in r.detail


# --- Lightning ----------------------------------------------------------------------------
@pytest.mark.xfail(strict=True, reason="dataloader-stall now ranks at 0.27 ms/step (1.2%) on top of cpu-optimizer: the optimizer's fix is replayed as the host's own work that much shorter (so that it adds to cpu-threads' fix), no longer as the span removed, and the loader wait keeps a little of the step; no measured twin of this run says which reading is right")
def test_lightning_cpu_run_finding_in_the_library_edits_the_modules_own_loader(tmp_path):
    pytest.importorskip("lightning")
    # A real CPU profile: the DataLoader wait's line is inside Lightning (its combined loader),
    # the DataLoader itself is built in the module's train_dataloader(). On this run the
    # optimizer's fix takes the same time, so the wait is only considered: its fix is written
    # when asked for, and says that it gains nothing here.
    report = analyze(DATA / "runs" / "lightning_module_cpu").to_dict()
    found, considered = report["findings"], report["considered"]
    stall = next(f for f in considered if f["rule"] == "dataloader-stall")
    assert all(s.startswith("lightning/") for s in stall["evidence"]["source"])
    assert "dataloader-stall" not in by_rule(plan_fixes(DATA / "lightning_module.py", found, considered=considered))
    plan = plan_fixes(DATA / "lightning_module.py", found, select=["dataloader-stall"], considered=considered)
    result = by_rule(plan)["dataloader-stall"]
    assert result.status == PLACED and "not in this script" in result.note and "lightning/" in result.note
    assert "gains nothing on this run" in result.note and result.promised_ms == stall["saving_alone_ms"]
    added = [l for l in plan.diff().splitlines()[2:] if l.startswith("+")]
    assert added == ["+        return DataLoader(data, batch_size=32, shuffle=True, num_workers=1, persistent_workers=True)"]
    fixed = tmp_path / "lightning_module.py"
    fixed.write_text(plan.fixed_text())
    runs_to_the_end(fixed)
    assert not plan_fixes(fixed, found, select=["dataloader-stall"], considered=considered).changed


@pytest.fixture(scope="module")
def nw0_benchmark_off(tmp_path_factory) -> Path:
    from test_fix import with_facts

    return with_facts(shared("traces/v100_resnet50_nw0"), tmp_path_factory.mktemp("nw0_off"), {"cudnn_benchmark": False})


def test_lightning_safe_fixes_and_the_trainers_own_settings(tmp_path, nw0_benchmark_off):
    pytest.importorskip("lightning")
    # The V100 run without workers, whose facts say cudnn.benchmark was off.
    report = analyze(nw0_benchmark_off).to_dict()
    found = [*report["findings"], *report["considered"]]  # every fix that fired, ranked or considered
    plan = plan_fixes(DATA / "lightning_module.py", found, unsafe=True)
    results = by_rule(plan)
    assert results["single-tensor-optimizer"].status == PLACED
    assert results["cudnn-benchmark"].status == PLACED
    assert results["h2d-pageable-copy"].status == PLACED and "library moves it" in results["h2d-pageable-copy"].note
    # Lightning zeroes the gradients and sets the precision: its settings, not an edit.
    assert results["zero-grad-memset"].status == SETTING and "set_to_none=True" in results["zero-grad-memset"].detail
    # bf16 is ranked once the loader's fix exposes the fp32 convolutions: Lightning sets the
    # precision, so it is the Trainer's setting, not an edit.
    bf16 = results["tensor-cores-unused"]
    assert bf16.status == SETTING and 'Trainer(precision="bf16-mixed")' in bf16.detail
    assert results["unfused-elementwise"].status == SETTING and "torch.compile(model)" in results["unfused-elementwise"].detail
    text = plan.fixed_text()
    assert "        return torch.optim.AdamW(self.parameters(), lr=1e-3, foreach=True)\n" in text
    assert "import lightning as L\nimport torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\ntorch.backends.cudnn.benchmark = True\n" in text
    site_packages_untouched(plan)
    fixed = tmp_path / "lightning_module.py"
    fixed.write_text(text)
    runs_to_the_end(fixed)
    again = plan_fixes(tmp_path / "lightning_module.py", found, unsafe=True)
    assert {r.rule for r in again.results if r.status == DONE} >= {"single-tensor-optimizer", "cudnn-benchmark", "h2d-pageable-copy"}


# --- transformers -------------------------------------------------------------------------
def test_transformers_trainer_gets_training_arguments(tmp_path, nw0_benchmark_off):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    # The workers from the sample's GPU run (its host's cores are recorded; the V100 trace's
    # are not), the rest from the V100 run (cudnn.benchmark off) and the H100 ViT run.
    stall = next(f for f in findings(SAMPLE_RUNS / "resnet18_cifar" / "runs" / "gpu_baseline") if f["rule"] == "dataloader-stall")
    found = [stall] + findings(nw0_benchmark_off) + findings(shared("whatif/h100_vit/baseline"))
    plan = plan_fixes(DATA / "hf_trainer.py", found, unsafe=True)
    results = by_rule(plan)
    # the value is the one the finding asks for (cores - 1 on one rank)
    workers = stall["evidence"]["cpu_count"] - 1
    assert f"num_workers={workers}" in stall["fix"]["snippet"]
    expected = {
        "dataloader-stall": f"transformers: TrainingArguments(dataloader_num_workers={workers}, dataloader_persistent_workers=True)",
        "h2d-pageable-copy": "transformers: TrainingArguments(dataloader_pin_memory=True)",
        "single-tensor-optimizer": 'transformers: TrainingArguments(optim="adamw_torch_fused")',
        "tf32-disabled": "transformers: TrainingArguments(tf32=True)",
        "tensor-cores-unused": "transformers: TrainingArguments(bf16=True)",
        "unfused-elementwise": "transformers: TrainingArguments(torch_compile=True)",
    }
    for rule, setting in expected.items():
        assert results[rule].status == SETTING and results[rule].detail == setting, results[rule]
    # The settings are real TrainingArguments parameters of the installed transformers.
    import inspect

    from transformers import TrainingArguments

    params = inspect.signature(TrainingArguments).parameters
    for setting in expected.values():
        inner = setting.split("TrainingArguments(", 1)[1].rstrip(")")
        for part in inner.split(", "):
            assert part.split("=")[0] in params, part
    # The one edit in the user's file: cudnn.benchmark after the imports.
    added = [l for l in plan.diff().splitlines()[2:] if l.startswith("+")]
    assert added == ["+torch.backends.cudnn.benchmark = True"]
    site_packages_untouched(plan)
    fixed = tmp_path / "hf_trainer.py"
    fixed.write_text(plan.fixed_text())
    runs_to_the_end(fixed)
    assert not plan_fixes(fixed, found, unsafe=True).changed
