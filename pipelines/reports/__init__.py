"""What a finished run is shown as: its summary and tables rebuilt from disk (``report``), the
HTML page (``report_html``, ``plots``) and paired comparisons of runs (``compare``)."""
