"""dash room of mlxlaunch (see DESIGN.md)."""

# Seconds between attempts to reach the server: here, so `mlx dash --help` shows the default
# without importing Textual.
RETRY_S = 2.0
