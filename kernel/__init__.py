"""What every stage shares that is not a data contract: the component registry (registry.py), config
files and their error format (config_io.py), and the policy model's builders (models/)."""
