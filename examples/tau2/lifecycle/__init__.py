"""A training run's life (core): checked before it starts, saved so a kill loses nothing, watched while
it runs, and what a dead controller leaves behind stopped."""
