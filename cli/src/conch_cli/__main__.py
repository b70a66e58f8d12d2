"""`python -m conch_cli` runs the `conch` command."""

from conch_cli.main import main

main()
