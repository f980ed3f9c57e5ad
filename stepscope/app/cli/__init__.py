"""The `stepscope` command: ``main`` parses and dispatches, one module per command group.

Nothing is imported here, so that `stepscope --help` loads the parser alone.
"""
