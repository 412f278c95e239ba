"""What a finished run is shown as, read from disk: ``report`` (its summary and tables rebuilt)
and ``compare`` (runs paired item by item) at the top, then four rooms: ``audits`` (how far to
trust the judges: agreement, length bias, order, self-consistency and wording), ``people``
(labels, overrides and their exchange with annotation tools), ``pages`` (the HTML page, the
viewer and labelling page, their templates and plots) and ``exports`` (flat rows, CSV /
Parquet / inspect_ai logs, experiment trackers)."""
