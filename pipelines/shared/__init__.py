"""Framework code more than one framework uses, in one place (frameworks do not import each other
for it): claim extraction (``claims``: ICAT's first stage, and what the claim extractors are
fine-tuned and evaluated on) and answer generation (``answering``: the ``generate`` framework
the ELI5 study runs for each responder)."""
