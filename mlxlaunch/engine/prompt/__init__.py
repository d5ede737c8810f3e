"""engine/prompt: chat-template rendering, incremental tokenization and system turns."""
