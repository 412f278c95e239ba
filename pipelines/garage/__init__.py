"""GaRAGe (Sorodoc et al.): grounded answers with citations, judged for eligibility, factuality,
relevance-aware factuality, deflection and attribution."""

from pipelines.garage.framework import GARAGE, eval_garage

STUDIES = [GARAGE]
COMMANDS = {"eval garage": eval_garage}
