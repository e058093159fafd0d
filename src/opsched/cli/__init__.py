"""The ``opsched`` command line."""
