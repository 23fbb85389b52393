"""The `hetobs` command line, installed as `hetobs.cli`.

One module per command, each with its own `typer.Typer` app, joined in `main.py`.
This package is the only part of hetobs that prints or exits; the library raises
typed exceptions and `main.main()` turns them into exit codes (`_exit_codes.py`).

Inside this package import only `hetobs.…` or relative names, never `cli.…`:
the repository folder `cli/` is installed as `hetobs/cli/` in the wheel.
"""
