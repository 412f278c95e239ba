"""Executing a run, top-down: ``execute`` (the entry: plan, run, summarise), ``plan`` (what an
invocation will do, decided before anything is written), ``identity`` (what a run is),
``model_content`` (each role's model known by content), ``models`` (a role connected to its
endpoint, or a vLLM server started for it), ``study`` (a study's runs one after another),
``solve`` (the missing items in one process), ``drivers`` (on N Ray actors), ``repeats``
(K seeded runs), ``grid`` (a paper table's models x runs) and ``nli_placement`` (where a
cross-encoder runs)."""
