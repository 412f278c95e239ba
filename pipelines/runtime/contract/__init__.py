"""The contract frameworks implement: what a framework declares and solves in (``protocol``:
``Framework``, ``Study``, ``ItemContext``, the run request and outcome), what it records per
item (``results``), its commands (``commands``), its roles and judge panels (``roles``,
``panels``), answers made elsewhere (``answers``), the configuration a run is asked with
(``config``), the one error for bad input (``errors``) and how frameworks are found by entry
point (``plugins``)."""
