"""The world store (issue 55): worlds kept outside the server's memory, in a local directory or
an S3-compatible object store (docs/WORLDS.md)."""
