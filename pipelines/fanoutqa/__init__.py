"""FanOutQA (Zhu et al.): three settings, string metrics equal to the original scorer, BLEURT and
the A-F model judge."""

from pipelines.fanoutqa.framework import FANOUTQA, eval_fanoutqa

STUDIES = [FANOUTQA]
COMMANDS = {"eval fanoutqa": eval_fanoutqa}
