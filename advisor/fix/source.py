"""The user's script as a concrete syntax tree (libcst): where things are, and the edits to it.

libcst keeps every comment, blank line and bracket of the file, so an edit changes the
characters it has to and nothing else. A fix family (loader.py, optimizer.py, ...) finds its
nodes through `Script`, and records what it wants changed in an `Edits`: keyword arguments
of a call set, statements inserted after a statement or after the imports, statements removed,
a run of statements wrapped in a `with` block. Edits name nodes of the one parsed tree, so
the edits of several fixes combine (two fixes setting keywords of the same DataLoader call
become one call), and `apply` writes them all in one pass.
"""

from __future__ import annotations

import codecs
import io
import re
import tokenize
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider

from advisor.errors import InputError
from advisor.metrics.source import NOT_IN_TRACE

FRAME = re.compile(r"^(?P<file>.+?)\((?P<line>\d+)\): (?P<func>.+)$")
# "user line not in the trace: its Python stack stops at FILE(LINE): FUNC, where profiling
# started": the frame named is one already open when profiling started (the script's loop).
OPEN_AT_START = re.compile("^" + re.escape(NOT_IN_TRACE).replace(re.escape("{frame}"), "(?P<frame>.+)") + "$")
LOOPS = (cst.For, cst.While)


def dotted(node: cst.CSTNode | None) -> str | None:
    """`torch.utils.data.DataLoader` for a Name/Attribute chain; None for anything else."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr.value}" if base else None
    return None


def code_of(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def keyword(call: cst.Call, name: str) -> cst.Arg | None:
    return next((a for a in call.args if a.keyword is not None and a.keyword.value == name), None)


def has_star_kwargs(call: cst.Call) -> bool:
    return any(a.star == "**" for a in call.args)


def _plain_positional(call: cst.Call) -> list[cst.Arg]:
    """The call's positional arguments up to the first keyword or starred one."""
    out = []
    for a in call.args:
        if a.keyword is not None or a.star:
            break
        out.append(a)
    return out


def argument(call: cst.Call, name: str, positional: tuple[str, ...] = ()) -> cst.Arg | None:
    """The argument that passes parameter NAME: its keyword, or its place among the positional
    arguments, POSITIONAL naming the callee's positional parameters in order
    (`DataLoader(ds, 4, False, None, None, 0)` passes num_workers sixth)."""
    found = keyword(call, name)
    if found is not None or name not in positional:
        return found
    plain = _plain_positional(call)
    i = positional.index(name)
    return plain[i] if i < len(plain) else None


def star_args_may_pass(call: cst.Call, name: str, positional: tuple[str, ...]) -> bool:
    """A `*args` of the call may be what passes NAME (it starts at or before NAME's place)."""
    if name not in positional:
        return False
    return any(a.star == "*" for a in call.args) and len(_plain_positional(call)) <= positional.index(name)


@dataclass
class Edits:
    """What one fix changes, by node of the parsed tree."""

    keywords: dict[cst.Call, dict[str, str]] = field(default_factory=dict)  # call -> {keyword: code}
    after: dict[cst.CSTNode, list[str]] = field(default_factory=dict)  # statement -> statements inserted after it
    remove: set[cst.CSTNode] = field(default_factory=set)  # statements removed
    wrap: dict[cst.CSTNode, tuple[cst.CSTNode, str]] = field(default_factory=dict)  # first stmt -> (last stmt, `with` header)
    values: dict[cst.Assign, str] = field(default_factory=dict)  # assignment -> its new value
    positional: dict[cst.Call, tuple[str, ...]] = field(default_factory=dict)  # call -> its positional parameters, in order

    def set_keywords(self, call: cst.Call, values: dict[str, str], positional: tuple[str, ...] = ()) -> None:
        """Set these arguments of the call; one it passes by position (POSITIONAL: the callee's
        positional parameters, in order) gets its new value there, never a second keyword."""
        self.keywords.setdefault(call, {}).update(values)
        if positional:
            self.positional[call] = positional

    def insert_after(self, statement: cst.CSTNode, lines: list[str]) -> None:
        self.after.setdefault(statement, []).extend(lines)

    def merge(self, other: Edits) -> None:
        for call, values in other.keywords.items():
            self.set_keywords(call, values, other.positional.get(call, ()))
        for stmt, lines in other.after.items():
            for line in lines:
                if line not in self.after.get(stmt, []):
                    self.insert_after(stmt, [line])
        self.remove |= other.remove
        self.wrap.update(other.wrap)
        self.values.update(other.values)

    @property
    def empty(self) -> bool:
        return not (self.keywords or self.after or self.remove or self.wrap or self.values)


class Script:
    """One parsed source file, with positions and parents of its nodes."""

    def __init__(self, path: Path, text: str, bom: bool = False, encoding: str = "utf-8") -> None:
        self.path = path
        self.text = text  # as in the file: its own line endings (CRLF stays CRLF), without a BOM
        self.bom = bom  # the file starts with a UTF-8 byte order mark, which the written file keeps
        self.encoding = encoding  # as the file declares it (PEP 263), the written file's too
        try:
            module = cst.parse_module(text)
        except cst.ParserSyntaxError as exc:
            raise InputError(path, f"not valid Python: {str(exc).splitlines()[0]} (line {exc.raw_line})") from None
        self.wrapper = MetadataWrapper(module)
        self.module = self.wrapper.module
        self.positions = self.wrapper.resolve(PositionProvider)
        self.parents = self.wrapper.resolve(ParentNodeProvider)
        self._nodes: list[cst.CSTNode] = []
        self.module.visit(_Collect(self._nodes))

    @classmethod
    def read(cls, path: Path) -> Script:
        """The script as its bytes say: line endings as they are (no newline translation) and a
        UTF-8 byte order mark noted, so that the written file differs only in the fix's lines."""
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise InputError(path, f"cannot read the script: {exc.strerror or exc}") from None
        bom = raw.startswith(codecs.BOM_UTF8)
        try:
            # the encoding Python reads it in: a `# -*- coding: latin-1 -*-` line, else UTF-8
            encoding = "utf-8" if bom else tokenize.detect_encoding(io.BytesIO(raw).readline)[0]
        except SyntaxError as exc:
            raise InputError(path, f"cannot read the script: {exc.msg if hasattr(exc, 'msg') else exc}") from None
        try:
            text = raw[len(codecs.BOM_UTF8):].decode("utf-8") if bom else raw.decode(encoding)
        except UnicodeDecodeError as exc:
            raise InputError(path, f"cannot read the script as {encoding}, the encoding it is read in: {exc.reason} at byte {exc.start}") from None
        return cls(path, text, bom, encoding)

    def encode(self, text: str) -> bytes:
        """TEXT (this script or a fixed version of it) as the file's bytes: in its declared
        encoding (UTF-8 by default), with the byte order mark where the script has one."""
        try:
            return (codecs.BOM_UTF8 if self.bom else b"") + text.encode(self.encoding)
        except UnicodeEncodeError as exc:
            raise InputError(self.path, f"the fix holds {text[exc.start:exc.end]!r}, which the script's encoding ({self.encoding}) cannot hold; nothing is written") from None

    # --- finding nodes -----------------------------------------------------------------------
    def nodes(self, kind: type | tuple[type, ...]) -> list:
        return [n for n in self._nodes if isinstance(n, kind)]

    def calls(self, *, name: str | None = None, last: str | set[str] | None = None, method: str | None = None) -> list[cst.Call]:
        """Calls by full dotted name, by the last part of it, or of a method (`x.zero_grad()`)."""
        out = []
        lasts = {last} if isinstance(last, str) else last
        for call in self.nodes(cst.Call):
            full = dotted(call.func)
            if name is not None and full == name:
                out.append(call)
            elif lasts is not None and full is not None and full.rsplit(".", 1)[-1] in lasts:
                out.append(call)
            elif method is not None and isinstance(call.func, cst.Attribute) and call.func.attr.value == method:
                out.append(call)
        return out

    def line(self, node: cst.CSTNode) -> int:
        return self.positions[node].start.line

    def lines(self, node: cst.CSTNode) -> range:
        p = self.positions[node]
        return range(p.start.line, p.end.line + 1)

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.parents.get(node)

    def ancestors(self, node: cst.CSTNode):
        p = self.parent(node)
        while p is not None:
            yield p
            p = self.parent(p)

    def statement_of(self, node: cst.CSTNode) -> cst.CSTNode:
        """The statement (a line of simple statements, or a compound statement) holding node."""
        for a in [node, *self.ancestors(node)]:
            if isinstance(a, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                return a
        raise ValueError("node outside any statement")

    def in_loop(self, node: cst.CSTNode) -> bool:
        """Inside the body of a for/while loop (not in a function defined inside one)."""
        for a in self.ancestors(node):
            if isinstance(a, LOOPS):
                return True
            if isinstance(a, (cst.FunctionDef, cst.ClassDef)):
                return False
        return False

    def enclosing_function(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        return next((a for a in self.ancestors(node) if isinstance(a, cst.FunctionDef)), None)

    def imports(self) -> set[str]:
        """The modules the script imports (`torch`, `transformers`, `lightning.pytorch`, ...)."""
        found: set[str] = set()
        for node in self.nodes((cst.Import, cst.ImportFrom)):
            if isinstance(node, cst.Import):
                found.update(dotted(a.name) or "" for a in node.names)
            elif node.module is not None and not node.relative:
                found.add(dotted(node.module) or "")
        return {m for m in found if m}

    def imported_names(self) -> dict[str, str]:
        """Local name -> what it is bound to by the imports (`DataLoader` -> `torch.utils.data.DataLoader`)."""
        names: dict[str, str] = {}
        for node in self.nodes((cst.Import, cst.ImportFrom)):
            if isinstance(node.names, cst.ImportStar):
                continue
            for alias in node.names:
                full = dotted(alias.name) or ""
                if isinstance(node, cst.ImportFrom):
                    if node.module is None or node.relative:
                        continue
                    full = f"{dotted(node.module)}.{full}"
                if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                    names[alias.asname.name.value] = full
                elif isinstance(node, cst.Import):  # `import torch.nn` binds `torch`
                    names[full.split(".")[0]] = full.split(".")[0]
                else:
                    names[full.rsplit(".", 1)[-1]] = full
        return names

    def imports_torch_as_torch(self) -> bool:
        return self.imported_names().get("torch") == "torch"

    def last_import(self) -> cst.CSTNode | None:
        """The last top-level `import` line before the first statement that is not an import
        (a docstring, `from __future__` and a `try: import ...` block are passed over)."""
        last = None
        for stmt in self.module.body:
            if isinstance(stmt, cst.SimpleStatementLine):
                if all(isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body):
                    last = stmt
                    continue
                if last is None and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr) and isinstance(stmt.body[0].value, cst.SimpleString):
                    continue  # the module docstring
                break
            if isinstance(stmt, cst.Try) and all(
                isinstance(s, cst.SimpleStatementLine) and all(isinstance(x, (cst.Import, cst.ImportFrom)) for x in s.body) for s in stmt.body.body
            ):
                continue  # try: import x / except ImportError: ...
            break
        return last

    def assignments(self, name: str) -> list[cst.Assign]:
        """`name = ...` statements (a plain name target), in source order."""
        out = []
        for node in self.nodes(cst.Assign):
            if any(isinstance(t.target, cst.Name) and t.target.value == name for t in node.targets):
                out.append(node)
        return out

    def frames(self, finding: dict, enclosing: bool = False) -> list[int]:
        """The lines of this script among a finding's `evidence.source` frames. With
        `enclosing`, also the line of the frame the stack stops at where the user's line is not
        in the trace: a frame open since profiling started, such as the loop that iterates the
        DataLoader (a place to look, not the line behind the op)."""
        out = []
        for frame, opened in recorded_frames(finding):
            m = FRAME.match(frame)
            if m and (enclosing or not opened) and _same_file(m.group("file"), self.path):
                out.append(int(m.group("line")))
        return out

    # --- writing -----------------------------------------------------------------------------
    def apply(self, edits: Edits) -> str:
        if edits.empty:
            return self.text
        code = self.module.visit(_Apply(edits)).code
        # libcst drops the last line end of a file whose lines end in a lone CR: put it back
        if self.text.endswith("\r") and not code.endswith(("\r", "\n")):
            code += "\r"
        return code


def compile_error(data: bytes, path: Path) -> str | None:
    """Why DATA (a script's bytes) does not compile as Python, in a few words; None when it does."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the script's own invalid escapes and the like
            compile(data, str(path), "exec", dont_inherit=True)
    except SyntaxError as exc:
        line = exc.lineno
        if line is None and b"\0" in data:  # "source code string cannot contain null bytes" names no line
            line = data.count(b"\n", 0, data.index(b"\0")) + 1
        return f"{exc.msg} (line {line})" if line is not None else exc.msg
    except (ValueError, TypeError) as exc:  # null bytes and the like
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return None


def recorded_frames(finding: dict) -> list[tuple[str, bool]]:
    """Each `evidence.source` frame of a finding, and whether it is only the frame its stack
    stops at (open since profiling started) rather than the user's line behind the op."""
    out = []
    for text in (finding.get("evidence") or {}).get("source") or []:
        m = OPEN_AT_START.match(str(text))
        out.append((m.group("frame"), True) if m else (str(text), False))
    return out


def _same_file(recorded: str, path: Path) -> bool:
    """A trace's file name against the script: the same file name, and the recorded folders,
    where given, the last folders of the script's path."""
    if Path(recorded).is_absolute():
        return Path(recorded) == path.resolve()
    rec = Path(recorded.replace("\\", "/")).parts
    mine = path.resolve().parts
    return bool(rec) and len(rec) <= len(mine) and tuple(mine[-len(rec):]) == tuple(rec)


class _Collect(cst.CSTVisitor):
    def __init__(self, out: list[cst.CSTNode]) -> None:
        super().__init__()
        self.out = out

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.out.append(node)
        return True


def _with_keywords(call: cst.Call, values: dict[str, str], positional: tuple[str, ...] = ()) -> cst.Call:
    """The call with these keyword arguments set: an existing one gets the new value (passed by
    keyword, or by position where POSITIONAL names the callee's positional parameters), a new
    one is appended in the layout of the arguments before it (one per line stays one per line)."""
    args = list(call.args)
    remaining = dict(values)
    for i, a in enumerate(_plain_positional(call)[: len(positional)]):
        if positional[i] in remaining:
            args[i] = a.with_changes(value=cst.parse_expression(remaining.pop(positional[i])))
    for i, a in enumerate(args):
        if a.keyword is not None and a.keyword.value in remaining:
            args[i] = a.with_changes(value=cst.parse_expression(remaining.pop(a.keyword.value)))
    if remaining:
        # `f(x for x in y)`: a bare generator is only valid as the call's sole argument; with
        # another argument beside it, it gets its own parentheses: `f((x for x in y), k=v)`.
        args = [_parenthesised(a) for a in args]
        no_space = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))
        one_per_line = len(args) >= 2 and all(isinstance(a.comma, cst.Comma) and isinstance(a.comma.whitespace_after, cst.ParenthesizedWhitespace) for a in args[-2:])
        if one_per_line:  # the new arguments go on lines of their own; the last one's comment stays with it
            sep = _uncommented(args[-2].comma)
            tail = _uncommented(args[-1].comma)
            own = args[-1].comma.whitespace_after.first_line
            args[-1] = args[-1].with_changes(comma=sep.with_changes(whitespace_after=sep.whitespace_after.with_changes(first_line=own)))
        elif args and isinstance(args[-1].whitespace_after_arg, cst.ParenthesizedWhitespace):
            # the closing bracket on a line of its own: each new argument on its own line, at
            # the last argument's indentation; the last argument's comment stays with it
            after = args[-1].whitespace_after_arg
            before = args[-2].comma.whitespace_after if len(args) >= 2 and isinstance(args[-2].comma, cst.Comma) else call.whitespace_before_args
            indent = before.last_line if isinstance(before, cst.ParenthesizedWhitespace) else after.last_line
            line = cst.ParenthesizedWhitespace(first_line=cst.TrailingWhitespace(), empty_lines=[], indent=after.indent, last_line=indent)
            sep = cst.Comma(whitespace_after=line)
            tail = cst.MaybeSentinel.DEFAULT
            args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=line.with_changes(first_line=after.first_line)), whitespace_after_arg=cst.SimpleWhitespace(""))
            new = [cst.Arg(value=cst.parse_expression(code), keyword=cst.Name(k), equal=no_space, comma=sep) for k, code in remaining.items()]
            new[-1] = new[-1].with_changes(comma=tail, whitespace_after_arg=after.with_changes(first_line=cst.TrailingWhitespace(), empty_lines=[]))
            return call.with_changes(args=args + new)
        elif args:
            sep = _uncommented(args[-2].comma) if len(args) >= 2 and isinstance(args[-2].comma, cst.Comma) else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            tail = args[-1].comma
            args[-1] = args[-1].with_changes(comma=sep)
        else:
            sep, tail = cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")), cst.MaybeSentinel.DEFAULT
        new = [cst.Arg(value=cst.parse_expression(code), keyword=cst.Name(k), equal=no_space, comma=sep) for k, code in remaining.items()]
        new[-1] = new[-1].with_changes(comma=tail)
        args += new
    return call.with_changes(args=args)


def _parenthesised(arg: cst.Arg) -> cst.Arg:
    value = arg.value
    if isinstance(value, cst.GeneratorExp) and not value.lpar:
        return arg.with_changes(value=value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()]))
    return arg


def _uncommented(comma: cst.Comma) -> cst.Comma:
    ws = comma.whitespace_after
    if isinstance(ws, cst.ParenthesizedWhitespace):
        return comma.with_changes(whitespace_after=ws.with_changes(first_line=cst.TrailingWhitespace()))
    return comma


class _Apply(cst.CSTTransformer):
    def __init__(self, edits: Edits) -> None:
        super().__init__()
        self.e = edits

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign) -> cst.Assign:
        value = self.e.values.get(original)
        return updated.with_changes(value=cst.parse_expression(value)) if value is not None else updated

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        values = self.e.keywords.get(original)
        return _with_keywords(updated, values, self.e.positional.get(original, ())) if values else updated

    def _body(self, originals, updated_body) -> list:
        out = []
        wrapping: tuple[cst.CSTNode, str] | None = None
        wrapped: list = []
        for orig, new in zip(originals, updated_body, strict=False):
            if orig in self.e.wrap and wrapping is None:
                wrapping = self.e.wrap[orig]
            if wrapping is not None:
                wrapped.append(new)
                if orig is wrapping[0]:
                    header = cst.parse_statement(f"{wrapping[1]}:\n    pass\n")
                    assert isinstance(header, cst.With)
                    first = wrapped[0].with_changes(leading_lines=[])  # its comments go above the `with`
                    out.append(header.with_changes(body=cst.IndentedBlock(body=[first, *wrapped[1:]]), leading_lines=wrapped[0].leading_lines))
                    wrapping, wrapped = None, []
                continue
            if orig in self.e.remove:
                continue
            out.append(new)
            for line in self.e.after.get(orig, []):
                out.append(cst.parse_statement(line + "\n"))
        return out

    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock) -> cst.IndentedBlock:
        body = self._body(original.body, updated.body)
        if not body:
            body = [cst.SimpleStatementLine(body=[cst.Pass()])]
        return updated.with_changes(body=body)

    def leave_Module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
        return updated.with_changes(body=self._body(original.body, updated.body))
