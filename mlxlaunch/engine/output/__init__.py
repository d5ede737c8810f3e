"""engine/output: the streaming output parser, its markers and the tool-call parsers."""
