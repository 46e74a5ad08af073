"""`python -m mystique ...`: the `mystique` command."""

from ._launcher import main

main()
