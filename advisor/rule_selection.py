"""Which rules run: `--select` / `--ignore` (and `select` / `ignore` in the configuration) read
the way linters read their rule selectors.

A selector is one of

- a rule id: `dataloader-stall`;
- a group: `memory`, `input`, `transfer`, `compute`, `host`, `optimizer`, `distributed`,
  `window`: the `GROUP` each rule file declares (a rule of the user's own may declare one too,
  an existing group or a new one; `advisor rules` shows each rule's group);
- a prefix of rule ids, ending at a dash: `h2d` selects `h2d-copy-volume` and
  `h2d-pageable-copy`, `memory` the memory group and `memory-growth`, `memory-near-limit`;
- `all`.

The rules that run are those any `select` selector names (every rule when there is none),
minus those any `ignore` selector names. A selector that names no rule is refused with one
line, and a close spelling is offered ("did you mean ...").
"""

from __future__ import annotations

from typing import Iterable, Protocol, TypeVar, Union

from advisor.errors import InputError, did_you_mean

ALL = "all"


class HasIdAndGroup(Protocol):
    id: str
    group: str


R = TypeVar("R", bound=HasIdAndGroup)


def selector_list(values: Union[str, Iterable[str], None]) -> list[str]:
    """Selectors as the command line takes them: one string or several, each a comma-separated
    list (`"input"`, `["input,optimizer", "h2d"]`); a lone string is one list, not its letters."""
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    return [part.strip() for v in values for part in str(v).split(",") if part.strip()]


def group_names(rules: Iterable[HasIdAndGroup]) -> set[str]:
    """The groups the rule files declare (their GROUP)."""
    return {r.group for r in rules if r.group}


def matching(selector: str, rules: list[R]) -> list[str]:
    """The rule ids a selector names, in `rules` order (empty when it names none)."""
    s = selector.strip().lower()
    if s == ALL:
        return [r.id for r in rules]
    return [r.id for r in rules if r.id == s or r.group == s or r.id.startswith(s + "-")]


def resolve(rules: list[R], select: Iterable[str] = (), ignore: Iterable[str] = ()) -> list[R]:
    """The rules to run, in their order; a selector that names no rule is an InputError."""
    chosen: set[str] = set()
    dropped: set[str] = set()
    select, ignore = selector_list(select), selector_list(ignore)
    for bucket, selectors, what in ((chosen, select, "select"), (dropped, ignore, "ignore")):
        for sel in selectors:
            hit = matching(sel, rules)
            if not hit:
                raise InputError(
                    None,
                    f"unknown rule, group or prefix {sel!r} in {what}{did_you_mean(sel, [*(r.id for r in rules), *group_names(rules)])}; "
                    "run `advisor rules` to list them",
                )
            bucket.update(hit)
    return [r for r in rules if (not select or r.id in chosen) and r.id not in dropped]
