"""The library version (one place; the facade, manifests and exports read it)."""

__version__ = "0.1.0"
