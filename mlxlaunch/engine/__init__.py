"""engine room of mlxlaunch (see DESIGN.md)."""
