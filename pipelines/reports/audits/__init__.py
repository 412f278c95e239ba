"""How far to trust the judges: agreement within a panel and with people (``agreement``), length
bias (``bias``), order (``swap``), and recorded judgements asked again for self-consistency and
rubric wording (``reask``)."""
