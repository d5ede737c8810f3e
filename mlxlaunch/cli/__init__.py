"""cli room of mlxlaunch (see DESIGN.md)."""
