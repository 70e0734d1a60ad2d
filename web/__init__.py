"""The browser client: static files only (index.html, ES modules, style.css).

The ingress serves them (`deployments/ingress/web.py`: `/` and `/static/...`); they talk to the
camera WebSocket next to the page. A package so that the files install as package data and
are found with `importlib.resources`, without the server importing the Python client.
"""
