"""What the layers below the run share: the file calls for local paths and object storage
(``remote``) and the optional dependencies, imported when first needed (``optional``)."""
