"""What a run is asked, as plain torch-free values: the choices offered (``choices``), the settings of
a run (``settings``: :class:`~.settings.Settings`, :class:`~.settings.Part`), how INPUT is read
(``input_options``), the request as a whole (``request``) and the measured rates that size a plan
(``rates``).  The command line builds them, and a spawned worker unpickles them, before torch is
imported: nothing here imports torch (a contract of scripts/test.sh).
"""
