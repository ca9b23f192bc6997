"""Delayed delivery: a timer in the storage layer (issue 35). See mqstore.timer.timer for the design."""
