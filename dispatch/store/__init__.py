"""The core's state port on the ORM's connection: the statements, the backend seam, the port."""

from dispatch.store.state import OrmState

__all__ = ["OrmState"]
