"""The FastAPI sampling service (see service/app.py and DESIGN.md, "HTTP service")."""
