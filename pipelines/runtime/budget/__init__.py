"""Budgets: what a run's model usage costs and the caps that stop admitting items (``costs``),
what a run will still ask before it asks it (``estimate``), and the dry run and pilot that
print it (``dry_run``)."""
