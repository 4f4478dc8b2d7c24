"""Looking at inputs and outputs without writing OUT: ``status``/``info``/``decode`` (``outputs``), the
corpus report (``report``), the single-item audits (``verify``) and the dry run (``dry_run``)."""
