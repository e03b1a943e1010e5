"""The input pipeline's fixes: DataLoader workers (dataloader-stall) and pinned memory with
non-blocking copies (h2d-pageable-copy). Both safe: the batches are the same, they are only
made earlier and in other processes, or copied from other memory.

Where no core is idle for the worker, the finding hands it one of the model's compute
threads: `torch.set_num_threads(N)` is written after the DataLoader's statement.

`prefetch_factor` is written when the finding names one value for it other than PyTorch's
default of 2 (a range such as "2-4" is advice, not a value, and is left to the user).

Which DataLoader: the one the finding's line iterates (`for x, y in loader:` at the line of
the script in the finding's evidence, or the loop its Python stack stops at where the user's
line is not in the trace), else the only DataLoader call of the script, else the
one a Lightning module's `train_dataloader()` returns. With several and nothing to tell them
apart, the fix is not placed and says so.
"""

from __future__ import annotations

import re

import libcst as cst

from advisor.fix.base import SAFE, Done, Outcome, Placed, Skipped, literal, number_after, register, text_of
from advisor.fix.libraries import library_of
from advisor.fix.source import Edits, Script, argument, code_of, has_star_kwargs, keyword, star_args_may_pass

# torch.utils.data.DataLoader's parameters that may be passed by position, in order (those
# after `generator` are keyword-only): `DataLoader(ds, 4, False, None, None, 0)` sets num_workers.
DATALOADER_POSITIONAL = (
    "dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "num_workers", "collate_fn",
    "pin_memory", "drop_last", "timeout", "worker_init_fn", "multiprocessing_context", "generator",
)  # fmt: skip
WORKERS = (r"set num_workers=(\d+)", r"raise it towards (\d+)", r"num_workers to about (\d+)", r"\(about (\d+) here\)", r"about (\d+)")


def dataloader_calls(script: Script) -> list[cst.Call]:
    """`DataLoader(...)`, `torch.utils.data.DataLoader(...)`, and the name it was imported as."""
    aliases = {local for local, full in script.imported_names().items() if full.rsplit(".", 1)[-1] == "DataLoader"}
    return script.calls(last={"DataLoader", *aliases})


def _iterated_name(node: cst.BaseExpression) -> str | None:
    """`loader` in `for b in loader`, `enumerate(loader)`, `tqdm(enumerate(loader), ...)`."""
    while isinstance(node, cst.Call) and node.args:
        node = node.args[0].value
    return node.value if isinstance(node, cst.Name) else None


def _loader_of_name(script: Script, name: str, calls: list[cst.Call]) -> cst.Call | None:
    values = [a.value for a in script.assignments(name)]
    found = [v for v in values if v in calls]
    return found[-1] if found else None


def loops_over(script: Script, call: cst.Call) -> list[cst.For]:
    """The for loops that iterate the name this DataLoader call is assigned to."""
    calls = [call]
    return [f for f in script.nodes(cst.For) if (n := _iterated_name(f.iter)) and _loader_of_name(script, n, calls) is call]


def training_loader(script: Script, finding: dict) -> cst.Call | Skipped | None:
    """The DataLoader call the finding is about; None when the script has none."""
    calls = dataloader_calls(script)
    if not calls:
        return None
    lines = set(script.frames(finding, enclosing=True))  # the loop open since profiling started counts
    for loop in script.nodes(cst.For):
        if script.line(loop) in lines and (name := _iterated_name(loop.iter)):
            call = _loader_of_name(script, name, calls)
            if call is not None:
                return call
    if len(calls) == 1:
        return calls[0]
    in_train = [c for c in calls if (fn := script.enclosing_function(c)) is not None and fn.name.value == "train_dataloader"]
    if len(in_train) == 1:
        return in_train[0]
    iterated = {c for c in calls if loops_over(script, c)}
    if len(iterated) == 1:
        return iterated.pop()
    where = ", ".join(str(script.line(c)) for c in calls)
    return Skipped(f"{len(calls)} DataLoader calls (lines {where}) and the finding's line does not say which one feeds the training loop")


def loader_argument(call: cst.Call, name: str) -> cst.Arg | None:
    """The argument of a DataLoader call that passes NAME, by keyword or by position."""
    return argument(call, name, DATALOADER_POSITIONAL)


def _passed_twice(call: cst.Call, name: str) -> bool:
    """NAME passed by keyword and by position at once: the call fails when it runs."""
    return keyword(call, name) is not None and argument(cst.Call(func=call.func, args=[a for a in call.args if a.keyword is None]), name, DATALOADER_POSITIONAL) is not None


def wanted_workers(finding: dict) -> int | None:
    text = text_of(finding)
    for pattern in WORKERS:
        m = re.search(pattern, text)
        if m:
            return int(m.group(1))
    snippet = (finding.get("fix") or {}).get("snippet") or ""
    m = re.search(r"num_workers=(\d+)", snippet)
    return int(m.group(1)) if m else None


def prefetch_factor(finding: dict) -> int | None:
    """The one prefetch_factor value the finding names (its text, then its snippet), if any."""
    for text in (text_of(finding), (finding.get("fix") or {}).get("snippet") or ""):
        m = re.search(r"prefetch_factor=(\d+)(?![\d-])", text)
        if m:
            return int(m.group(1))
    return None


def _library_or_skip(script: Script, rule: str, finding: dict, value: object = None) -> Outcome:
    lib = library_of(script)
    if lib is not None:
        return lib.setting(rule, finding, value)
    return Skipped("no DataLoader(...) call in the script: the batches come from somewhere the fix cannot see")


@register(
    "dataloader-stall",
    "DataLoader worker processes (num_workers, persistent_workers)",
    SAFE,
)
def fix_workers(script: Script, finding: dict) -> Outcome:
    text = text_of(finding)
    wanted = wanted_workers(finding)
    if "already uses the cores" in text:
        return Skipped("the finding asks for less work per sample (prepare the data once, lighter augmentation), not for a DataLoader setting")
    if wanted is None:
        return Skipped(
            "the finding names no worker count (its trace does not record the host's CPU cores): set num_workers to about "
            "(CPU cores / ranks) - 1 by hand, or fix from a run of `advisor profile`, which records them"
        )
    call = training_loader(script, finding)
    if call is None:
        return _library_or_skip(script, "dataloader-stall", finding, wanted)
    if isinstance(call, Skipped):
        return call
    if has_star_kwargs(call):
        return Skipped(f"the DataLoader call at line {script.line(call)} passes **kwargs: num_workers may be set there")
    if star_args_may_pass(call, "num_workers", DATALOADER_POSITIONAL):
        return Skipped(f"the DataLoader call at line {script.line(call)} passes *args: num_workers may be set there")
    if _passed_twice(call, "num_workers"):
        return Skipped(f"the DataLoader call at line {script.line(call)} passes num_workers both by position and by keyword (a TypeError when it runs): keep one")
    current = loader_argument(call, "num_workers")
    value = literal(current.value) if current is not None else 0
    edits = Edits()
    notes = []
    what_first: list[str] = []
    expr = None  # the script's own expression for num_workers, kept
    if current is not None and value is ...:
        expr = code_of(current.value)
        source = _setting_of(script, current.value)
        if source is None:
            return Skipped(
                f"num_workers={expr} at line {script.line(call)} is the script's own setting, and no command-line switch or "
                f"assignment here sets it: make it {wanted} where {expr} is set (with persistent_workers=True)"
            )
        node, default, described = source
        if not (isinstance(default, int) and not isinstance(default, bool) and default >= wanted):
            if isinstance(node, cst.Call):
                edits.set_keywords(node, {"default": str(wanted)})
            else:
                edits.values[node] = str(wanted)
            what_first.append(f"{described} at line {script.line(node)}: {default!r} becomes {wanted} (num_workers={expr} is kept)")
            if isinstance(node, cst.Call):
                notes.append(f"the switch still sets the workers: `{flag_of(node) or expr} N` on the command line overrides the new default")
        value = default
    persistent = keyword(call, "persistent_workers")
    on_when = f"{expr} > 0" if expr is not None else "True"  # no persistent workers without workers
    persistent_on = persistent is not None and (literal(persistent.value) is True or code_of(persistent.value) == on_when)
    values: dict[str, str] = {}
    if expr is None and not (isinstance(value, int) and value >= wanted):
        values["num_workers"] = str(wanted)
    if wanted > 0 and not persistent_on:
        values["persistent_workers"] = on_when
    prefetch = prefetch_factor(finding)
    current_prefetch = keyword(call, "prefetch_factor")
    prefetch_code = str(prefetch) if expr is None else f"{prefetch} if {expr} > 0 else None"
    if wanted > 0 and prefetch is not None and prefetch != 2 and (current_prefetch is None or (literal(current_prefetch.value) != prefetch and code_of(current_prefetch.value) != prefetch_code)):
        values["prefetch_factor"] = prefetch_code
    if not values and edits.empty:
        shown = expr if expr is not None else value
        return Done(f"the DataLoader at line {script.line(call)} already has num_workers={shown}" + (f", persistent_workers={code_of(persistent.value)}" if persistent_on else ""))
    if values:
        edits.set_keywords(call, values, DATALOADER_POSITIONAL)
    what = "; ".join(what_first + ([f"DataLoader at line {script.line(call)}: " + ", ".join(f"{k}={v}" for k, v in values.items())] if values else []))
    threads = number_after(r"torch\.set_num_threads\(", finding)
    if threads is not None:
        # No idle core: the finding's fix hands a compute thread to the worker; without it the
        # worker takes its core from the model's threads and the step gets longer.
        if script.calls(name="torch.set_num_threads"):
            notes.append(f"the script sets its threads itself: set them to {threads} there, so the worker has a core")
        elif not script.imports_torch_as_torch():
            notes.append(f"add torch.set_num_threads({threads}) before training, so the worker has a core (`torch` is not imported as torch here)")
        else:
            edits.insert_after(script.statement_of(call), [f"torch.set_num_threads({threads})  # a core for the loader worker"])
            what += f"; torch.set_num_threads({threads}) after it"
    return Placed(edits, what, "; ".join(notes))


def _setting_of(script: Script, node: cst.BaseExpression) -> tuple[cst.CSTNode, object, str] | None:
    """Where the script's own num_workers expression is set, so that the fix changes it there
    and the expression stays: (node to edit, its current value, what it is in words).

    `args.workers`: the argparse switch that makes the attribute (`add_argument("--workers",
    ...)`, `"--num-workers"` for `num_workers`, or `dest="workers"`), whose `default=` is
    changed; a plain name: its one assignment to a literal number (`workers = 0`). None
    where neither is found (a config object, a function's parameter): not guessed."""
    if isinstance(node, cst.Attribute):
        attr = node.attr.value
        found = []
        for call in script.calls(method="add_argument"):
            if has_star_kwargs(call):
                continue
            flags = [literal(a.value) for a in call.args if a.keyword is None]
            dest = keyword(call, "dest")
            dest_value = literal(dest.value) if dest is not None else None
            longs = [f for f in flags if isinstance(f, str) and f.startswith("--")]
            named = dest_value if isinstance(dest_value, str) else (longs[0][2:].replace("-", "_") if longs else None)
            if named == attr:
                found.append(call)
        if len(found) != 1:
            return None
        call = found[0]
        default = keyword(call, "default")
        action = keyword(call, "action")
        if action is not None or (default is not None and literal(default.value) is ...):
            return None  # a counting or store_const switch, or a computed default: not guessed
        flag = flag_of(call) or attr
        return call, (literal(default.value) if default is not None else None), f"the script's {flag} switch"
    if isinstance(node, cst.Name):
        assigns = script.assignments(node.value)
        if len(assigns) == 1 and len(assigns[0].targets) == 1 and isinstance(literal(assigns[0].value), int):
            return assigns[0], literal(assigns[0].value), f"`{node.value} = ...`"
    return None


def flag_of(call: cst.Call) -> str | None:
    """The long option of an `add_argument` call (`--workers`), if any."""
    longs = [f for f in (literal(a.value) for a in call.args if a.keyword is None) if isinstance(f, str) and f.startswith("--")]
    return longs[0] if longs else None


def _to_calls_in(script: Script, loop: cst.For) -> list[cst.Call]:
    """`x.to(device, ...)` calls in the loop's body on the names the loop unpacks."""
    names = {n.value for n in _names(loop.target)}
    out = []
    for call in script.calls(method="to"):
        receiver = call.func.value if isinstance(call.func, cst.Attribute) else None
        if isinstance(receiver, cst.Name) and receiver.value in names and loop in script.ancestors(call):
            if call.args and (call.args[0].keyword is None or call.args[0].keyword.value == "device"):
                out.append(call)
    return out


def _names(target: cst.BaseExpression) -> list[cst.Name]:
    if isinstance(target, cst.Name):
        return [target]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [n for e in target.elements for n in _names(e.value)]
    return []


@register(
    "h2d-pageable-copy",
    "pinned batches (pin_memory=True) and non-blocking copies (.to(device, non_blocking=True))",
    SAFE,
)
def fix_pinned(script: Script, finding: dict) -> Outcome:
    call = training_loader(script, finding)
    if call is None:
        return _library_or_skip(script, "h2d-pageable-copy", finding)
    if isinstance(call, Skipped):
        return call
    if has_star_kwargs(call):
        return Skipped(f"the DataLoader call at line {script.line(call)} passes **kwargs: pin_memory may be set there")
    if star_args_may_pass(call, "pin_memory", DATALOADER_POSITIONAL):
        return Skipped(f"the DataLoader call at line {script.line(call)} passes *args: pin_memory may be set there")
    edits = Edits()
    done: list[str] = []
    pin = loader_argument(call, "pin_memory")
    if pin is not None and literal(pin.value) is True:
        done.append(f"the DataLoader at line {script.line(call)} already pins memory")
    else:
        edits.set_keywords(call, {"pin_memory": "True"}, DATALOADER_POSITIONAL)
    own = pin is not None and literal(pin.value) is ...  # the script's own setting: it becomes True, and it says so
    copies = [c for loop in loops_over(script, call) for c in _to_calls_in(script, loop)]
    for c in copies:
        nb = keyword(c, "non_blocking")
        if nb is None or literal(nb.value) is not True:
            edits.set_keywords(c, {"non_blocking": "True"})
    if edits.empty:
        return Done("; ".join(done) + (", and its loop copies with non_blocking=True" if copies else ""))
    what = [f"pin_memory=True on the DataLoader at line {script.line(call)}"] if call in edits.keywords else []
    changed = [c for c in copies if c in edits.keywords]
    if changed:
        what.append(f"non_blocking=True on {len(changed)} copies (line{'s' if len(changed) > 1 else ''} {', '.join(str(script.line(c)) for c in changed)})")
    note = "" if copies else "no `.to(device)` of the loop's batch in the script (the library moves it): only the pinning is written"
    if not copies and library_of(script) is None:
        note = "no `x.to(device)` of the loop's own names found: copy the batch with non_blocking=True where it is moved"
    if own and call in edits.keywords:
        said = f"pin_memory={code_of(pin.value)} (the script's own setting) becomes True: that setting no longer turns pinning off"
        note = f"{said}; {note}" if note else said
    return Placed(edits, "; ".join(what), note)
