"""The command line: typer only. Parse, call core, render; no logic of its own."""
