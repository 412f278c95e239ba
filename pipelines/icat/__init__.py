"""ICAT (Samarinas et al.): factuality and aspect coverage of long-form answers."""
