"""All SQL of the registry. Repositories take a ``Session``, read and ``flush()``; they never commit.

Modules: ``pagination`` (opaque keyset cursors), ``base_models``, ``adapters`` (adapters and
versions), ``tenants`` (tenants, API keys, grants), ``audit``, ``state`` (the registry revision).
"""
