"""The training run around the workflow: config and loader, validation and the dry-run plan, allocation,
datasets, GRPO groups (scored as a whole), train/serve parity, resume and tracking."""
