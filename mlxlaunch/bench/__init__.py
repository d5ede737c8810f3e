"""bench room of mlxlaunch (see DESIGN.md)."""
