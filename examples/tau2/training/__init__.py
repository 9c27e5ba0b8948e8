"""The AReaL layer (core): the trainer, the workflow that scores a GRPO group as one object, and the
prompt the proxy records as the serving engine renders it."""
