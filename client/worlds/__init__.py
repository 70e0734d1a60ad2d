"""The server's saved worlds from the command line: commands.py (worlds, export, import,
delete over HTTP), session.py (open and reopen: a saved world continued or run again)."""
