"""What the terminal needs beside cli.py: the HTTP client, the REPL, formatting, progress and the spinner."""
