"""The one place where committed log records become store writes: the apply worker thread, the
bulk store loader, the record-by-record apply (and the rebuild of a store from local logs)."""
