"""What puts the components together: the command line, the local broker, `undertow run` and its
supervisor, the run file's one model, the monitor. Nothing below imports it."""
