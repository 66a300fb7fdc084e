"""The commands that are not training: ``check``/``keys``/``plugins``/``hooks`` text (describe), ``env``, ``export``
and ``generate``. Each module is imported only when its command runs."""
