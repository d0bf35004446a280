"""`undertow run`: the stages as child processes, their supervision and restarts, the run file and its rules."""
