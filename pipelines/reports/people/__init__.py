"""People in the loop: their labels and the labelling queue (``labels``), their overrides of a
verdict (``overrides``), and both exchanged with annotation tools (``exchange``)."""
