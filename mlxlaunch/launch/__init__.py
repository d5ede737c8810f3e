"""launch room of mlxlaunch (see DESIGN.md)."""
