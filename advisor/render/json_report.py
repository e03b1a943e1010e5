"""The versioned JSON report (schema `advisor/report/v1`, documented in README.md)."""

from __future__ import annotations

from advisor.analysis import Analysis
from advisor.output import jsonable, rounded, to_json_text


def to_json(analysis: Analysis) -> str:
    """The report's figures to 7 significant digits (advisor.output.rounded): within a millionth of each."""
    return to_json_text(rounded(jsonable(analysis.to_dict())))
