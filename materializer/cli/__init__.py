"""The ``materializer`` command line, one module per command group (:mod:`.commands` holds the group
and the run/get/export commands)."""

from materializer.cli.commands import CLEANER_LOG_FILE, EXIT_ABSENT, EXIT_FAILURE, main

__all__ = ["CLEANER_LOG_FILE", "EXIT_ABSENT", "EXIT_FAILURE", "main"]
