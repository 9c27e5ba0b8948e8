"""The curriculum as an add-on: sampling training tasks by solve rate (off by default), and the workflow
that reports outcomes to it."""
