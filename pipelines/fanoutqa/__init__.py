"""FanOutQA (Zhu et al.): three settings, string metrics equal to the original scorer, BLEURT and
the A-F model judge."""
