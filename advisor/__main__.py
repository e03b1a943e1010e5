"""`python -m advisor` and the `advisor` console script.

`advisor --version` is answered here, before the command line's modules (typer, the
commands) are imported; everything else is `advisor.cli.program`.
"""

import sys


def program() -> None:
    if sys.argv[1:] == ["--version"]:
        from advisor.version import __version__

        sys.stdout.write(f"advisor {__version__}\n")
        sys.stdout.flush()
        return
    from advisor.cli import program as run

    run()


if __name__ == "__main__":
    program()
