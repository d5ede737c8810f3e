"""engine/cache: the prefix cache, its block trie and snapshots, the disk tier, miss diagnostics."""
