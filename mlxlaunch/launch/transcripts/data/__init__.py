"""Requests captured from each agent version, for what its transcripts do not record."""
