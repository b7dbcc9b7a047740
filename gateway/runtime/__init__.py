"""The daemon at run time: assembly, the local API, reload, systemd, backup, upkeep and metrics."""
