"""Jobs on a data dir or a broker's log dir with no broker running: compact, restore (from a
broker's log dir or an SST snapshot), dump-log."""
