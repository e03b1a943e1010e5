"""C++ names as people read them: `_ZN17cutlass__5x_cudnn6KernelI...` becomes
`void cutlass__5x_cudnn::Kernel<...>(...)` in the reports.

Traces name some kernels by their mangled (Itanium ABI) symbol. The C++ runtime that every
PyTorch installation already loads has the demangler (`__cxa_demangle`); it is called
through ctypes, on names of bounded length only. A name it does not accept (some cutlass
kernels are beyond it) is shown by its qualified name, `cutlass__5x_cudnn::Kernel<…>(…)`,
read from the mangled form's leading names; failing that, as it is. Display only: the
analysis keeps the trace's own names.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import re
from functools import lru_cache
from typing import Callable, Optional

# Longer names are shown as they are: the demangler recurses over the name's nesting.
MAX_MANGLED = 4096


@lru_cache(maxsize=1)
def _runtime() -> Optional[tuple[Callable, Callable]]:
    """(__cxa_demangle, free) from the C++ runtime, or None where there is none."""
    for name in ("stdc++", "c++abi", "c++"):
        path = ctypes.util.find_library(name)
        candidates = [path] if path else []
        candidates += {"stdc++": ["libstdc++.so.6"], "c++abi": ["libc++abi.dylib"], "c++": ["libc++.1.dylib"]}[name]
        for candidate in candidates:
            try:
                lib = ctypes.CDLL(candidate)
                fn = lib.__cxa_demangle
            except (OSError, AttributeError):
                continue
            fn.restype = ctypes.c_void_p
            fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
            libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
            libc.free.argtypes = [ctypes.c_void_p]
            libc.free.restype = None
            return fn, libc.free
    return None


@lru_cache(maxsize=4096)
def demangle(name: str) -> str:
    """The readable form of a mangled C++ name; any other name unchanged."""
    if not name.startswith("_Z") or len(name) > MAX_MANGLED or "\x00" in name:
        return name
    runtime = _runtime()
    if runtime is None:
        return name
    cxa_demangle, free = runtime
    status = ctypes.c_int(-1)
    try:
        raw = name.encode("ascii")
    except UnicodeEncodeError:
        return name
    out = cxa_demangle(raw, None, None, ctypes.byref(status))
    text = None
    if out:
        try:
            text = ctypes.string_at(out).decode("utf-8", "replace") if status.value == 0 else None
        finally:
            free(out)
    return text or qualified_name(name) or name


_LENGTH = re.compile(r"\d+")


def qualified_name(mangled: str) -> str | None:
    """`ns::Name<…>(…)` from the leading nested name of an Itanium-mangled symbol, or None.

    Reads only `_ZN` [CV-qualifiers] (`St` | <length><identifier>)+ and whether template
    arguments follow: enough to say which kernel it is when the full form cannot be had.
    """
    if not mangled.startswith("_ZN"):
        return None
    pos = 3
    while pos < len(mangled) and mangled[pos] in "rVKRO":
        pos += 1
    parts: list[str] = []
    if mangled.startswith("St", pos):
        parts.append("std")
        pos += 2
    while True:
        m = _LENGTH.match(mangled, pos)
        if m is None:
            break
        n = int(m.group())
        ident = mangled[m.end() : m.end() + n]
        if n == 0 or len(ident) < n:
            return None
        parts.append(ident)
        pos = m.end() + n
    if not parts:
        return None
    template = "<…>" if mangled.startswith("I", pos) else ""
    return "::".join(parts) + template + "(…)"
