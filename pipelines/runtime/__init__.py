"""The runtime every framework plugs into, in four rooms: ``contract`` (what a framework
implements and declares, and the configuration a run is asked with), ``execution`` (how a run
is planned, connected to its models, solved, spread over drivers and repeated), ``store`` (the
run directory: records, summary, provenance, resume) and ``budget`` (costs, caps, estimates,
the dry run); beside them ``stats`` (metric helpers) and ``terminal`` (tables any terminal
reads). It imports no framework, no report and no command-line library."""
