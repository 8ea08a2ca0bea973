"""The extension backend's engine: commands run as Go flannel runs them, and per-peer
bookkeeping. ``command.py`` runs one command; ``peers.py`` decides which to run."""
