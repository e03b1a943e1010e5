"""Number formatting and escaping shared by the HTML, Markdown and diff renderers.

Every string that comes from a trace (op and kernel names, file names, rule messages that
quote them) goes through `esc` (HTML) or `md` (Markdown) before it reaches the output. Both
also take out what would act on a terminal or reorder the text around it (escape sequences,
control characters, bidirectional controls such as U+202E; see advisor.terminal_text), and
bytes of a file name that are not UTF-8 (shown as `\\xNN`).
"""

from __future__ import annotations

import html
import math
import re
from typing import Any

from advisor.analysis import Analysis
from advisor.engine.critical_path import departs_from_estimate
from advisor.sizes import format_bytes
from advisor.terminal_text import BIDI_CONTROLS, multi_line, one_line, valid_unicode
from advisor.units import rate, saved_text  # noqa: F401  (one rounding of throughput, one way to say a saving, for every renderer)

NS_PER_MS = 1e6


# C0 controls but tab and line breaks, DEL and C1 (ESC, BEL, NUL, CSI...): nothing a page shows,
# and a page copied into a terminal must not carry them.
_HTML_CONTROLS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def esc(value: Any) -> str:
    """HTML-escape a value for text or a quoted attribute (`<`, `>`, `&`, `"`, `'`), without
    control characters or bidirectional controls (they would reorder the page's text around
    the value)."""
    s = valid_unicode(value if isinstance(value, str) else str(value))
    return html.escape(_HTML_CONTROLS.sub("", BIDI_CONTROLS.sub("", s)), quote=True)


# CommonMark lets any ASCII punctuation be backslash-escaped. These are the characters that
# can open raw HTML, an entity, a link or image, emphasis, a code span, strikethrough, a
# heading or a table cell; escaped, a trace string is only ever text.
# An underscore inside a word (num_workers) cannot open emphasis in GFM and stays as it is.
_MD_PUNCT = re.compile(r"([\\`*\[\]<>|~&#]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9]))")


def md(value: Any) -> str:
    """Markdown-escape a value for running text or a table cell (one line)."""
    s = re.sub(r"\s+", " ", one_line(value)).strip()
    return _MD_PUNCT.sub(lambda m: "\\" + m.group(0), s)


def md_code_block(code: str, lang: str = "") -> str:
    """A fenced code block whose fence is longer than any backtick run inside it."""
    code = multi_line(code)
    longest = max((len(m) for m in re.findall(r"`+", code)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{lang}\n{code.rstrip()}\n{fence}"


fmt_bytes = format_bytes  # memory sizes in binary units (advisor.sizes)


def pct(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:.{digits}f}%"


def ms(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.{digits}f} ms"


def signed(x: float | None, unit: str = "", digits: int = 2) -> str:
    """`+1.23 ms` / `-4.56 ms`: changes always carry their sign."""
    if x is None or not math.isfinite(x):
        return "n/a"
    sep = "" if unit in ("", "%") else " "
    return f"{x:+.{digits}f}{sep}{unit}"


def batch_size(a: Analysis) -> int | None:
    """The batch size from the run's facts file (`advisor profile`), when it was recorded."""
    return a.batch_size()


def step_time_text(st: dict[str, Any], steps: int) -> str:
    """`78.60 ms mean (median 85.34, p90 91.67, min 57.21, max 93.25) over 3 steps`."""
    return (
        f"{st['mean']:.2f} ms mean (median {st['median']:.2f}, p90 {st['p90']:.2f}, min {st['min']:.2f}, max {st['max']:.2f})"
        f" over {steps} step{'s' if steps != 1 else ''}"
    )


def throughput(a: Analysis) -> tuple[float, str] | None:
    """(value, unit): samples/s when the batch size is known, else steps/s, from the mean step
    (the JSON report's `summary.throughput`, unrounded)."""
    return a.throughput()


def finding_rank(a: Analysis, f: Any) -> str:
    """Which rank a finding's figures were measured on, for a run of several ranks ("" for
    one): the rank where the finding was largest, and the other ranks where it also fired."""
    if len(a.ranks) < 2 or f.rank is None:
        return ""
    also = [r for r in f.evidence.get("ranks", []) if r != f.rank]
    more = f" (also on rank{'s' if len(also) > 1 else ''} {', '.join(str(r) for r in also[:8])}{', …' if len(also) > 8 else ''})" if also else ""
    return f"rank {f.rank}{more}"


def ranks_line(a: Analysis) -> str:
    """What the overview's figures and the findings' figures are, for a run of several ranks."""
    return (
        f"{len(a.ranks)}; step times per step are the slowest rank's, the other figures above are rank "
        f"{a.primary.rank}'s (the slowest on average); each finding names the rank it was measured on"
    )


def short_value(v: Any, limit: int = 300, whole: bool = False) -> str:
    """An evidence value as one readable line (lists shortened, floats rounded); `whole`
    keeps every string whole (a pipe: names are for grep, not for a terminal's width)."""
    if isinstance(v, dict):
        return ", ".join(f"{k}={short_value(x, 80, whole)}" for k, x in v.items())
    if isinstance(v, (list, tuple)):
        items = [short_value(x, 160, whole) for x in v[:6]]
        more = f" (+{len(v) - 6} more)" if len(v) > 6 else ""
        return "; ".join(items) + more
    if isinstance(v, float):
        return f"{v:.4g}"
    s = str(v)
    return s if whole or len(s) <= limit else s[: limit - 1] + "…"


def saving_note(f: Any) -> str:
    """What a reader needs beside a finding's ranked saving: " (alone 116.14)" where its saving
    alone differs, "rule's estimate 8.00" where the replay departs from its rule's estimate
    (`evidence.estimate_ms`); "" where neither."""
    notes = []
    alone = getattr(f, "saving_alone_ms", None)
    if alone is not None and f.saving_ms is not None and abs(alone - f.saving_ms) >= 0.005:
        notes.append(f"alone {alone:.2f}")
    estimate = f.evidence.get("estimate_ms")
    if f.saving_ms is not None and departs_from_estimate(estimate, alone if alone is not None else f.saving_ms):
        notes.append(f"rule's estimate {estimate:.2f}")
    return f" ({'; '.join(notes)})" if notes else ""


def order_note(findings: list[Any], i: int) -> str:
    """Why the i-th finding (0-based) sits below findings whose ranked figure is smaller: the
    list is sorted by that figure except where a saving is measured on top of fixes it needs
    (evidence `depends_on`) or an "up to" promise was passed over for a measured fix of like
    size (evidence `ranked_after_measured`, advisor.engine.ranking); "" where it is in order."""
    f = findings[i]
    if f.saving_ms is None:
        return ""
    smaller = [g for g in findings[:i] if g.saving_ms is not None and g.saving_ms < f.saving_ms - 0.005]
    if not smaller:
        return ""
    below = ", ".join(g.rule for g in smaller)
    measured = [g.rule for g in smaller if g.rule in (f.evidence.get("ranked_after_measured") or ())]
    if measured:
        return (f"listed below {', '.join(measured)}: a fix that measured pairs confirm goes before an \"up to\" promise "
                "of like size (within 2×); it saves this on top of the fixes above it")
    if any(isinstance(d, str) for d in f.evidence.get("depends_on") or ()):
        return f"listed below {below}: it saves this only with the fixes above it in"
    return f"listed below {below}: it saves this on top of the fixes above it"
