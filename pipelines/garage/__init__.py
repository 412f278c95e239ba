"""GaRAGe (Sorodoc et al.): grounded answers with citations, judged for eligibility, factuality,
relevance-aware factuality, deflection and attribution."""

from pipelines.garage.framework import GARAGE, eval_garage
from pipelines.garage.reproduce import REPRODUCE_GARAGE, reproduce_garage

STUDIES = [GARAGE, REPRODUCE_GARAGE]
COMMANDS = {"eval garage": eval_garage, "reproduce garage": reproduce_garage}
