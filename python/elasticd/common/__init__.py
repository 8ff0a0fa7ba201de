"""Names shared by elasticd's framework modules, at Horovod's import paths."""
