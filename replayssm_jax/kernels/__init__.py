"""GDN kernels: one file per kernel, each with its pure-jnp ``*_reference`` (the ``xla`` backend)."""
