"""The run's settings (core): the config and how a command line becomes one, the add-ons it turns on,
the tasks it trains on, and the settings docs written from the docstrings."""
