"""The run store: a run directory (``run_dir``: the manifest, per-item results appended
atomically, torn tails repaired, resume), its typed records (``manifest``: manifest, summary,
study), JSON Lines read on use (``lines``), the summary computed from the records
(``summary``), what the numbers rest on by content (``provenance``) and answers other harnesses
wrote, read as they write them (``harness_answers``)."""
