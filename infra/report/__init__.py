"""What a run leaves to read: the report and its page, the metrics log, `tail`, a namespace's lag."""
