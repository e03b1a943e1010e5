"""Training loops that live in a library: the setting to change in its API, never its files.

A `transformers` Trainer builds the DataLoader, the optimizer, the autocast and the compiled
model itself, from `TrainingArguments`; a Lightning `Trainer` runs the loop, the precision and
the zeroing of gradients. When a finding's code is not in the script (no DataLoader call, no
optimizer, no backward pass of its own) and the script trains with one of them, the fix is
the library's own setting, printed for the user to set, since site-packages is not theirs
to edit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from advisor.fix.base import Outcome, Setting, Skipped
from advisor.fix.source import Script

# rule -> the setting; {n} is the finding's value (workers, batch size) where it has one.
TRANSFORMERS = {
    "dataloader-stall": "TrainingArguments(dataloader_num_workers={n}, dataloader_persistent_workers=True)",
    "h2d-pageable-copy": "TrainingArguments(dataloader_pin_memory=True)",
    "single-tensor-optimizer": 'TrainingArguments(optim="adamw_torch_fused")',
    "tf32-disabled": "TrainingArguments(tf32=True)",
    "tensor-cores-unused": "TrainingArguments(bf16=True)",
    "unfused-elementwise": "TrainingArguments(torch_compile=True)",
    "launch-bound": 'TrainingArguments(torch_compile=True, torch_compile_mode="reduce-overhead")',
    "spare-gpu-memory": "TrainingArguments(per_device_train_batch_size={n}, learning_rate=<scaled with the batch>)",
    "zero-grad-memset": "nothing to set: the Trainer zeroes gradients with model.zero_grad(), set_to_none by default in PyTorch 2",
    "empty-cache": 'TrainingArguments(torch_empty_cache_steps=None)',
}
LIGHTNING = {
    "dataloader-stall": "DataLoader(..., num_workers={n}, persistent_workers=True) in the module's train_dataloader()",
    "h2d-pageable-copy": "DataLoader(..., pin_memory=True) in the module's train_dataloader() (Lightning copies pinned batches non-blocking)",
    "tensor-cores-unused": 'Trainer(precision="bf16-mixed")',
    "tf32-disabled": 'torch.set_float32_matmul_precision("high") before Trainer(...)',
    "cudnn-benchmark": "Trainer(benchmark=True)",
    "unfused-elementwise": "model = torch.compile(model) before trainer.fit(model)",
    "launch-bound": 'model = torch.compile(model, mode="reduce-overhead") before trainer.fit(model)',
    "zero-grad-memset": "nothing to set: Lightning calls optimizer.zero_grad() with set_to_none=True by default (override optimizer_zero_grad only if you changed it)",
    "spare-gpu-memory": "DataLoader(..., batch_size={n}) in train_dataloader(), with the learning rate scaled to match",
}


@dataclass(frozen=True)
class Library:
    name: str
    settings: dict[str, str]

    def setting(self, rule: str, finding: dict, value: object = None) -> Outcome:
        template = self.settings.get(rule)
        if template is None:
            return Skipped(f"the code is inside {self.name}, which has no setting for this fix")
        if "{n}" in template:
            if value is None:
                m = re.search(r"→ (\d+)", str((finding.get("fix") or {}).get("text") or ""))
                value = int(m.group(1)) if m else None
            if value is None:
                return Skipped(f"the code is inside {self.name}, and the finding gives no value to set")
            template = template.replace("{n}", str(value))
        return Setting(self.name, template)


def library_of(script: Script) -> Library | None:
    """The training library the script drives, if any (by its imports)."""
    mods = script.imports()
    if any(m == "transformers" or m.startswith("transformers.") for m in mods):
        names = script.imported_names()
        if any(v.startswith("transformers") and v.rsplit(".", 1)[-1] in ("Trainer", "Seq2SeqTrainer", "TrainingArguments") for v in names.values()) or "transformers" in names:
            return Library("transformers", TRANSFORMERS)
    if any(m.split(".")[0] in ("lightning", "pytorch_lightning") for m in mods):
        return Library("lightning", LIGHTNING)
    return None
