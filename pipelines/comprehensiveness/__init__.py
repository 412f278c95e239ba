"""Comprehensiveness metrics (Dejl et al.): NLI-based, Q&A-based and end-to-end.

``common`` holds the options and items, ``framework`` the framework, the ELI5 study and
``evaluate_item``, ``meta`` the meta-evaluation tables, ``reproduce`` the paper's grid."""
