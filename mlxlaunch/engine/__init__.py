"""engine room of mlxlaunch (see DESIGN.md): a face (engine, types, config, settings, stats)
over the sub-rooms scheduling/, cache/, prompt/, decoding/, output/ and runtime/; their import
rules are in docs/architecture.md and tests/test_rooms.py."""
