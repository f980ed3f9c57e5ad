"""The Attach page: pick a running process, start an attach, follow it to its end."""
