"""fsmc: a declarative state-machine spec compiler for Python and PostgreSQL."""

__version__ = "0.1.0"
