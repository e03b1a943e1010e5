"""`python -m advisor.cli.profile_main SCRIPT [-- ARGS]`: the profile command on its own.

The same as `advisor profile`, for environments where the `advisor` entry point is not on
PATH (and for the tests). Bad input: one line on stderr, exit code 2.
"""

from __future__ import annotations

import sys

import typer

from advisor.cli.profile import profile
from advisor.errors import EXIT_BAD_INPUT, InputError

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
app.command("profile", context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "allow_interspersed_args": False})(profile)


def main(argv: list[str] | None = None) -> None:
    try:
        code = app(args=argv, prog_name="advisor profile", standalone_mode=False)
    except InputError as exc:
        sys.stderr.write(f"advisor: error: {exc.line()}\n")
        sys.exit(EXIT_BAD_INPUT)
    except typer.Abort:
        sys.stderr.write("advisor: interrupted\n")
        sys.exit(130)
    except Exception as exc:
        # usage errors of the command-line parser (click's, vendored by some typer versions
        # and not others): told apart by what they offer, not by a private import
        if hasattr(exc, "show") and hasattr(exc, "exit_code"):
            exc.show()
            sys.exit(EXIT_BAD_INPUT)
        raise
    if isinstance(code, int) and code:
        sys.exit(code)


if __name__ == "__main__":
    main()
