"""The advisor's one cache: parsed frames and finished analyses, bounded, keyed on content.

A second report of an unchanged trace skips the parse (a *frames* entry: one Parquet file per
frame) and, for every report format, `whatif`, `gate`, `baseline` and `diff`, metrics and
rules too (an *analysis* entry: per rank the small scalar figures and per-step tables, a
FramesHeader instead of the frames, the findings and warnings of the run, and the slowest
rank's view that the HTML report, whatif and diff read: advisor.rank_view).

Where entries go (`ADVISOR_CACHE`):

- unset, `on`: the user cache folder `platformdirs.user_cache_dir("torch-advisor")`
  (`$XDG_CACHE_HOME/torch-advisor` else `~/.cache/torch-advisor` on Linux,
  `~/Library/Caches/torch-advisor` on macOS, `%LOCALAPPDATA%\\torch-advisor\\Cache` on
  Windows); nothing is written beside the user's traces. With no usable home (HOME unset
  and no passwd entry) nothing is cached.
- `beside`: `<trace dir>/.advisor-cache/`, else the user cache folder where the trace's
  folder is not writable.
- a folder (`~` is expanded): every entry under it. `off`: no cache.

One keying scheme for both kinds: an entry's folder is named by the digest of its key, and
the key holds the SHA-256 of the trace files' bytes (computed while a trace is read for
parsing, so an entry stands for exactly the bytes that were parsed), never their paths: two
copies of a trace share an entry. The advisor's version and code, the cache format, and for
an analysis the facts files' bytes, the file names, the rules and options are in the key too.

Every entry is sealed: `seal.json`, written last (so it marks a complete entry), lists the
SHA-256 of each file in the entry and the key digest, with an HMAC-SHA256 over them under a
per-installation secret (`secret.key`, 32 random bytes, mode 0600, in the user cache folder).
On read the seal is checked first (a seal the secret did not make, a file that changed, or an
entry written for another key is a miss), then every value with its type (dtypes, times that
are non-negative and add up, categories of the fixed kinds, findings as typed structures). So
an entry shipped along with a log dir, copied from another run, edited or damaged is never
served: the report is made again. Every error in the cache reads as a miss; the cache never
fails a report. Nothing is pickled.

Only what the advisor made is ever removed or written into: eviction and `advisor cache
clear` remove an entry only when its seal verifies under the secret (a folder being written
carries a marker made with the same secret), and the remembered trace hashes only when their
own seal does; a folder named `analysis-*` or `frames-*` that the advisor did not seal is left
alone. No symbolic link is followed: a `.advisor-cache` beside the traces that is a link is
not used at all, an entry that is a link is neither read, replaced nor removed, and the
cache's own files (seals, the secret, the hashes) are opened without following links and
without blocking (a FIFO there is a miss, never a hang).

An analysis entry also keeps the reports rendered from it to stdout (text, JSON, Markdown;
see advisor.cache.reports): a second `advisor report` asked for in the same way writes the
stored text before the command line parser is built (advisor.cli.warm), in about 0.1 s at
any trace size, importing neither pandas, pyarrow nor rich; this package imports NumPy,
pandas and the trace loader only where an entry's tables are read or written.

Size: the entries under a cache folder are kept under `ADVISOR_CACHE_MAX_BYTES` (default 2G;
`500M`, `8G`, ...): after each write the least recently used entries (a hit marks an entry
used) are removed first. `advisor cache info` shows the folder, its entries and their size;
`advisor cache clear` removes them.

The modules, one job each: `settings` (where entries go, the size cap), `seal` (the secret, the
seal and the marker of a folder being written), `digests` (the remembered trace hashes),
`store` (reading and writing sealed entries), `eviction` (least recently used first, `clear`),
`frames` (frames entries), `analyses` (analysis entries and their key), `entry_types` (what an
analysis entry holds, as types), `plain` (values as JSON, exactly), `reports` (rendered
reports) and `lazy` (NumPy and pandas on first use). This package gives their names as one.
"""

from __future__ import annotations

from typing import Any

from advisor.cache.settings import APP_NAME, OFF_WORDS, ON_WORDS, BESIDE, MAX_BYTES_ENV, DEFAULT_MAX_BYTES, cache_setting, cache_enabled, cache_beside, expand_home, cache_dir_setting, user_cache_root, cache_roots, max_cache_bytes, writable, may_write_under
from advisor.cache.seal import SEAL_FILE, KEY_FILE, KEY_BYTES, MAKING_FILE, SMALL_FILE_BYTES, BadEntry, secret, seal, entry_name, _making_mark
from advisor.cache.digests import HASH_READ_BYTES, DIGESTS_DIR, content_digest, trace_digest, remember_digest
from advisor.cache.eviction import KINDS, EntryInfo, entries, evict, clear
from advisor.cache.store import read_entry, write_entry
from advisor.cache.frames import FRAMES_META, FRAMES_FORMAT, FRAME_TABLES, JSON_COLUMNS, fixed_categories, DEVICE_PROPERTY_COLUMNS, loader_fields, MIN_PARSE_SECONDS, CacheKey, read_cached, frames_entry, frame_dtypes, write_cached, load_cached
from advisor.cache.plain import TAG, Unstorable, to_plain, from_plain
from advisor.cache.entry_types import NonNegative, Share, CopyEntry, RankEntry, EntryMeta, typed_results, BREAKDOWN_COLUMNS, KERNEL_TOTAL_COLUMNS, STEP_DTYPES, check_tables
from advisor.cache.analyses import ANALYSIS_META, ANALYSIS_FORMAT, MIN_ANALYSIS_SECONDS, TABLES, COMM_TABLES, LIBRARIES, AnalysisKey, CachedRun, write_analysis, read_analysis, read_analysis_entry, analysis_entry
from advisor.cache.reports import REPORT_PREFIX, read_report, store_report

# Names this package gave from the loader before it imported the loader on first use.
_FROM_LOADER = {"load_trace": "advisor.load.trace", "TraceFrames": "advisor.load.trace", "HOST_KINDS": "advisor.load.trace", "DEVICE_KINDS": "advisor.load.trace"}

__all__ = ['APP_NAME', 'OFF_WORDS', 'ON_WORDS', 'BESIDE', 'MAX_BYTES_ENV', 'DEFAULT_MAX_BYTES', 'cache_setting', 'cache_enabled', 'cache_beside', 'expand_home', 'cache_dir_setting', 'user_cache_root', 'cache_roots', 'max_cache_bytes', 'writable', 'may_write_under', 'SEAL_FILE', 'KEY_FILE', 'KEY_BYTES', 'MAKING_FILE', 'SMALL_FILE_BYTES', 'BadEntry', 'secret', 'seal', 'entry_name', '_making_mark', 'HASH_READ_BYTES', 'DIGESTS_DIR', 'content_digest', 'trace_digest', 'remember_digest', 'KINDS', 'EntryInfo', 'entries', 'evict', 'clear', 'read_entry', 'write_entry', 'FRAMES_META', 'FRAMES_FORMAT', 'FRAME_TABLES', 'JSON_COLUMNS', 'fixed_categories', 'DEVICE_PROPERTY_COLUMNS', 'loader_fields', 'MIN_PARSE_SECONDS', 'CacheKey', 'read_cached', 'frames_entry', 'frame_dtypes', 'write_cached', 'load_cached', 'TAG', 'Unstorable', 'to_plain', 'from_plain', 'NonNegative', 'Share', 'CopyEntry', 'RankEntry', 'EntryMeta', 'typed_results', 'BREAKDOWN_COLUMNS', 'KERNEL_TOTAL_COLUMNS', 'STEP_DTYPES', 'check_tables', 'ANALYSIS_META', 'ANALYSIS_FORMAT', 'MIN_ANALYSIS_SECONDS', 'TABLES', 'COMM_TABLES', 'LIBRARIES', 'AnalysisKey', 'CachedRun', 'write_analysis', 'read_analysis', 'read_analysis_entry', 'analysis_entry', 'REPORT_PREFIX', 'read_report', 'store_report']


def __getattr__(name: str) -> Any:
    if name in _FROM_LOADER:
        import importlib

        return getattr(importlib.import_module(_FROM_LOADER[name]), name)
    if name == "FIELDS":
        return loader_fields()
    if name == "FIXED_CATEGORIES":
        return fixed_categories()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
