"""`python -m localrt` is the `localrt` command."""
from cli import app

app(prog_name="localrt")
