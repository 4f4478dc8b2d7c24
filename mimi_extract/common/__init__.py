"""What the layers below the run share: the file calls for local paths and object storage
(``remote``), the optional dependencies, imported when first needed (``optional``), and the bound
on a message's lines (``messages``)."""
