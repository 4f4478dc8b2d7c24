"""The command line: the typer app and its commands (``app``), the request a command line asks
(``request``) and the address-space check made before torch is imported (``limits``)."""
