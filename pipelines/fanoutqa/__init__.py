"""FanOutQA (Zhu et al.): three settings, string metrics equal to the original scorer, BLEURT and
the A-F model judge."""

from pipelines.fanoutqa.framework import FANOUTQA, eval_fanoutqa
from pipelines.fanoutqa.reproduce import REPRODUCE_FANOUTQA, reproduce_fanoutqa

STUDIES = [FANOUTQA, REPRODUCE_FANOUTQA]
COMMANDS = {"eval fanoutqa": eval_fanoutqa, "reproduce fanoutqa": reproduce_fanoutqa}
