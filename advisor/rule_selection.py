"""Which rules run: `--select` / `--ignore` (and `select` / `ignore` in the configuration) read
the way linters read their rule selectors.

A selector is one of

- a rule id: `dataloader-stall`;
- a group: `memory`, `input`, `transfer`, `compute`, `host`, `optimizer`, `distributed`,
  `window` (the table below; `advisor rules` shows each rule's group);
- a prefix of rule ids, ending at a dash: `h2d` selects `h2d-copy-volume` and
  `h2d-pageable-copy`, `memory` the memory group and `memory-growth`, `memory-near-limit`;
- `all`.

The rules that run are those any `select` selector names (every rule when there is none),
minus those any `ignore` selector names. A selector that names no rule is refused with one
line, and a close spelling is offered ("did you mean ...").
"""

from __future__ import annotations

import difflib
from typing import Iterable, Protocol, TypeVar

from advisor.errors import InputError

GROUPS: dict[str, tuple[str, ...]] = {
    "input": ("dataloader-stall", "epoch-end"),
    "transfer": ("h2d-copy-volume", "h2d-pageable-copy", "cpu-tensor-then-copy", "d2d-copy-volume"),
    "memory": ("allocator-churn", "empty-cache", "memory-growth", "memory-near-limit", "spare-gpu-memory"),
    "compute": ("channels-last", "cpu-autocast", "cudnn-benchmark", "tensor-cores-unused", "tf32-disabled", "unfused-elementwise"),
    "host": ("cpu-threads", "gpu-idle", "host-sync", "inference-mode", "launch-bound"),
    "optimizer": ("cpu-optimizer", "single-tensor-optimizer", "zero-grad-memset"),
    "distributed": ("communication-exposed", "data-parallel", "straggler", "unbucketed-allreduce"),
    "window": ("step-time-variance",),
}
GROUP_OF = {rid: group for group, ids in GROUPS.items() for rid in ids}
ALL = "all"


class HasId(Protocol):
    id: str


R = TypeVar("R", bound=HasId)


def group_of(rule_id: str) -> str:
    """The rule's group ("" for a rule of the user's own that no group lists)."""
    return GROUP_OF.get(rule_id, "")


def matching(selector: str, ids: list[str]) -> list[str]:
    """The rule ids a selector names, in `ids` order (empty when it names none)."""
    s = selector.strip().lower()
    if s == ALL:
        return list(ids)
    members = set(GROUPS.get(s, ()))
    return [rid for rid in ids if rid == s or rid in members or rid.startswith(s + "-")]


def did_you_mean(word: str, ids: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the closest rule id or group, or ''."""
    close = difflib.get_close_matches(word.lower(), [*ids, *GROUPS], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def resolve(rules: list[R], select: Iterable[str] = (), ignore: Iterable[str] = ()) -> list[R]:
    """The rules to run, in their order; a selector that names no rule is an InputError."""
    ids = [r.id for r in rules]
    chosen: set[str] = set()
    dropped: set[str] = set()
    select, ignore = list(select), list(ignore)
    for bucket, selectors, what in ((chosen, select, "select"), (dropped, ignore, "ignore")):
        for sel in selectors:
            hit = matching(sel, ids)
            if not hit:
                raise InputError(
                    None,
                    f"unknown rule, group or prefix {sel!r} in {what}{did_you_mean(sel, ids)}; "
                    "run `advisor rules` to list them",
                )
            bucket.update(hit)
    return [r for r in rules if (not select or r.id in chosen) and r.id not in dropped]
