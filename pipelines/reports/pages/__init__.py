"""Pages: one self-contained HTML page of runs (``report_html`` and its template, ``plots``) and
the viewer that serves it page by page with a labelling page per run (``viewer``)."""
