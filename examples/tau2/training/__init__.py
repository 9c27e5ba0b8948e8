"""The training run around the workflow: config and loader, validation and the dry-run plan, allocation,
datasets, the group filter, train/serve parity, resume and tracking."""
