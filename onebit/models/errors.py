"""Errors raised while loading a model directory or rendering its chat template."""


class ModelLoadError(Exception):
    """A model file is missing, unreadable or malformed; the message names the file."""


class ChatTemplateError(ValueError):
    """The chat template failed to render (syntax error, runtime error, refused access)."""
