"""`python -m localrt` is the `localrt` command."""

from cli import entry

entry()
