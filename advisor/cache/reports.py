"""Rendered reports kept in an analysis entry: a second `advisor report` asked for in the same
way writes the stored text."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path
from typing import Any

import orjson

from advisor.files import replace_file
from advisor.load.discover import RunFiles
from advisor.cache.analyses import ANALYSIS_META, AnalysisKey
from advisor.cache.eviction import evict
from advisor.cache.seal import _open_entry, _sha, seal, secret
from advisor.cache.store import read_entry


# --- rendered reports ---------------------------------------------------------------------------
# An analysis entry also keeps the reports rendered from it (text, JSON, Markdown to stdout), one
# file each, under the entry's seal: a second `advisor report` of an unchanged run writes the
# stored text without importing pandas, pyarrow or the rules. A report's file is named by the
# digest of what its text depends on beyond the analysis (`fields`: format, options, the path as
# given and the files found, where it is written) and of the entry's analysis files (so a
# report never outlives the analysis it was rendered from), and carries its own HMAC over that
# name and its text: an entry sealed again around an edited report still does not serve it.
REPORT_PREFIX = "report-"
MAX_REPORTS = 16  # per entry (a terminal of each new size adds one): the least recently written go first


def _report_name(files: dict[str, bytes], fields: dict[str, Any]) -> str:
    analysis = sorted((n, _sha(b)) for n, b in files.items() if not n.startswith(REPORT_PREFIX))
    body = orjson.dumps({"analysis": analysis, "report": fields}, option=orjson.OPT_SORT_KEYS, default=str)
    return f"{REPORT_PREFIX}{_sha(body)[:40]}.json"


def _report_mac(key: bytes, name: str, text: str, err: str = "") -> str:
    signed = ["report", name, text] if not err else ["report", name, text, err]
    return hmac.new(key, orjson.dumps(signed), hashlib.sha256).hexdigest()


def read_report(run: RunFiles, key: AnalysisKey, fields: dict[str, Any]) -> tuple[str, str] | None:
    """The report rendered before for this analysis key and these fields, from a sealed entry
    whose every file still matches its seal: (its stdout, its stderr: the notes and warnings
    after it); None otherwise."""
    found = read_entry("analysis", key.digest, run.directory)
    secret_key = secret()
    if found is None or secret_key is None or ANALYSIS_META not in found[1]:
        return None
    name = _report_name(found[1], fields)
    try:
        doc = orjson.loads(found[1][name])
        text, mac, err = doc["text"], doc["mac"], doc.get("err", "")
        if doc.get("name") != name or not isinstance(text, str) or not isinstance(mac, str) or not isinstance(err, str):
            return None
        return (text, err) if hmac.compare_digest(mac, _report_mac(secret_key, name, text, err)) else None
    except (KeyError, TypeError, orjson.JSONDecodeError):
        return None


def store_report(folder: Path, key: AnalysisKey, fields: dict[str, Any], text: str, err: str = "") -> Path | None:
    """Add a rendered report to the analysis entry in `folder` (the one the report was rendered
    from) and seal it again over the files as verified now; the report's file, or None."""
    secret_key = secret()
    files = _open_entry(folder, "analysis", key.digest) if secret_key is not None else None
    if files is None or ANALYSIS_META not in files:
        return None
    name = _report_name(files, fields)
    data = orjson.dumps({"name": name, "text": text, **({"err": err} if err else {}), "mac": _report_mac(secret_key, name, text, err)})
    try:
        reports = sorted((n for n in files if n.startswith(REPORT_PREFIX) and n != name), key=lambda n: (folder / n).stat().st_mtime_ns)
        dropped = reports[: max(0, len(reports) + 1 - MAX_REPORTS)]
        replace_file(folder / name, data, sync=False, mode=0o600)
        seal(folder, "analysis", key.digest, secret_key, {**{n: b for n, b in files.items() if n not in dropped}, name: data})
        for n in dropped:
            (folder / n).unlink(missing_ok=True)
    except OSError:
        return None
    evict(folder.parent, keep=folder)
    return folder / name
