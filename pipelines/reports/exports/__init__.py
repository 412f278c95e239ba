"""Runs where people analyse them: every item's record as a flat row (``rows``), written as CSV
or Parquet (``export``) or an inspect_ai log (``inspect_log``), and runs logged to an
experiment tracker (``tracking``)."""
