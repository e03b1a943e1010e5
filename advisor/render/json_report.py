"""The versioned JSON report (schema `advisor/report/v1`, documented in README.md)."""

from __future__ import annotations

from advisor.analysis import Analysis
from advisor.output import to_json_text


def to_json(analysis: Analysis) -> str:
    return to_json_text(analysis.to_dict())
