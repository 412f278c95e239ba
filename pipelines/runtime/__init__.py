"""The runtime every framework plugs into: what a framework declares (``protocol``), which model
plays which role (``roles``), how a run executes, resumes and sums up (``runner``,
``runstore``, ``identity``, ``results``, ``summary``), how each role's model is opened
(``evaluator``, ``nli_placement``), configuration (``config``, ``registry``), repeats (with
``stats``) and grids, and budgets, estimates and plans (``costs``, ``estimate``,
``planning``). It imports no framework, no report and no command-line library."""
