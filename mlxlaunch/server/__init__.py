"""server room of mlxlaunch (see DESIGN.md)."""
