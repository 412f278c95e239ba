"""GaRAGe (Sorodoc et al.): grounded answers with citations, judged for eligibility, factuality,
relevance-aware factuality, deflection and attribution."""
