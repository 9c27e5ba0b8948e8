"""Process plumbing every entry point shares: atomic files, charts, logging, exits, dependency pins."""
