"""CRUX (retrieval-context evaluation): answerability ratings, Cov / alpha-nDCG / Den
(``framework``, ``metrics``), data building (``build``), the paper's grid (``reproduce``)."""
