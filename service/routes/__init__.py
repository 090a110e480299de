"""The service's routes, one `APIRouter` per job; `service.app.create_app` includes them all."""
