"""engine/decoding: the decoding plan, grammars, tool-call grammars and the thinking budget."""
