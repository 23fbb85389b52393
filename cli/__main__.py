"""`python -m hetobs.cli`: the same as the `hetobs` console script."""

from hetobs.cli.main import main

main()
