"""ktrain-plugin-template: ``ktrain new-plugin NAME`` writes a new plugin package from ``skeleton/``.

``entry`` registers the command; ``render`` fills the skeleton's ``{{placeholders}}``.
"""
