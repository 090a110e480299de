"""The FastAPI sampling service (see service/app.py and docs/design.md, "HTTP service")."""
