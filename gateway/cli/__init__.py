"""``switchboard``: one module per command group."""
