"""Tiny Lambda handlers the twin's tests run in-process (stand-ins for functions/handlers)."""
