"""dash room of mlxlaunch (see DESIGN.md)."""
