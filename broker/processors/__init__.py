"""Request processors: one module per area, each a class with ``async`` handlers taking
``(connection, command)`` and returning the response."""
