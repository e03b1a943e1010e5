"""A promise in its parts: what each piece of a bundled fix (torch.compile, autocast) is worth,
its bound, and whether a measured pair has checked the model behind it.

A rule lists its parts in the finding's evidence (`promise_parts`); once the replay has
priced the fix alone, `settle_parts` makes them add up to that saving: the modelled parts keep
their figures (scaled down together where the replay gives less than they sum to), and the
part marked `rest` takes what the replay adds on top of them (or takes away: the host's cost
of generated code, casts that outweigh their gain). A part no measured pair has checked is
an "up to" figure, and a finding with one is ranked behind a measured fix of like size
(`advisor.engine.ranking`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

# A part under this (ms per step) is not worth a line.
MIN_PART_MS = 0.005


@dataclass
class PromisePart:
    """One piece of a bundled fix's saving: `ms` per step, at most `bound_ms` (what `bound`
    names); `checked_by` names the measured pair that checked its model, None where none did."""

    part: str
    ms: float
    bound_ms: float | None
    bound: str
    checked_by: str | None = None
    rest: bool = False

    def as_evidence(self) -> dict:
        d = asdict(self)
        d["ms"] = round(self.ms, 3) + 0.0  # never "-0"
        d["bound_ms"] = None if self.bound_ms is None else round(self.bound_ms, 3)
        d["up_to"] = self.checked_by is None
        return d


def parts_of(evidence: dict) -> list[dict]:
    parts = evidence.get("promise_parts")
    return [p for p in parts if isinstance(p, dict)] if isinstance(parts, list) else []


def unchecked_ms(evidence: dict) -> float:
    """What of a promise no measured pair has checked (its "up to" parts, ms per step)."""
    return sum(max(float(p.get("ms") or 0.0), 0.0) for p in parts_of(evidence) if p.get("up_to"))


def settle_parts(evidence: dict, promise_ms: float) -> None:
    """Make the parts add up to the replayed promise (the fix alone, ms per step)."""
    parts = parts_of(evidence)
    if not parts:
        return
    modelled = [p for p in parts if not p.get("rest")]
    gains = sum(float(p["ms"]) for p in modelled if float(p["ms"]) > 0)
    costs = sum(float(p["ms"]) for p in modelled if float(p["ms"]) < 0)
    # the gains the replay does not give (a step the host holds) are scaled down together
    scale = min(1.0, max(promise_ms - costs, 0.0) / gains) if gains > 0 else 1.0
    for p in modelled:
        p["ms"] = round(float(p["ms"]) * (scale if float(p["ms"]) > 0 else 1.0), 3) + 0.0  # never "-0"
    rest = [p for p in parts if p.get("rest")]
    left = round(promise_ms - sum(p["ms"] for p in modelled), 3)
    if rest:
        rest[0]["ms"] = left
    elif modelled and abs(left) >= 0.001:
        modelled[-1]["ms"] = round(modelled[-1]["ms"] + left, 3)
    evidence["promise_parts_total_ms"] = round(promise_ms, 3)


def parts_text(evidence: dict) -> str:
    """One sentence: each part with its figure, "up to" where no measured pair checked it."""
    shown = []
    for p in parts_of(evidence):
        ms = float(p.get("ms") or 0.0)
        if abs(ms) < MIN_PART_MS:
            continue
        figure = f"up to {ms:.2f} ms" if p.get("up_to") and ms > 0 else f"{ms:.2f} ms"
        bound = f" of at most {p['bound_ms']:.2f}" if p.get("bound_ms") is not None and ms > 0 else ""
        shown.append(f"{p['part']} {figure}{bound}")
    if not shown:
        return ""
    sources: dict[str, list[str]] = {}
    for p in parts_of(evidence):
        if p.get("checked_by") and abs(float(p.get("ms") or 0.0)) >= MIN_PART_MS:
            sources.setdefault(p["checked_by"], []).append(p["part"])
    unchecked = [p["part"] for p in parts_of(evidence) if p.get("up_to") and float(p.get("ms") or 0.0) >= MIN_PART_MS]
    said = f"In parts ({'; '.join(shown)})"
    if unchecked:
        said += f": no measured pair has checked {', '.join(unchecked)}, so {'that is an upper figure' if len(unchecked) == 1 else 'those are upper figures'}"
    for source, names in sources.items():
        said += f"; {', '.join(names)} checked on {source}"
    return said + "."
