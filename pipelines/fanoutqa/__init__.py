"""FanOutQA (Zhu et al.): data loader and metrics equal to the original scorer's."""
