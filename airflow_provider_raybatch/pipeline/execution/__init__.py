"""What runs on Ray Data: reading ranges, the stage workers around the user's predictors,
writing and committing each range's files, and the watchdog over a run's progress."""
