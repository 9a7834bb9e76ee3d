"""Training with what the ladder found: the trainer (`train`) and the winner in the user's own loop (`winner`)."""
