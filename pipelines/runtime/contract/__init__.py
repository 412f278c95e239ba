"""The contract frameworks implement: what a framework declares (``protocol``: ``Framework``,
``Study``, the run request and outcome), the per-item context it solves in (``context``:
``ItemContext``), what it records per item (``results``), its commands (``commands``), its roles
and judge panels (``roles``, ``panels``), answers made elsewhere (``answers``), the configuration
a run is asked with (``config``), the input readers (``readers``), the one error for bad input
(``errors``) and how frameworks are found, installed or from their file (``plugins``)."""
