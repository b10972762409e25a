"""Reading policy files: bounded reads, the source map, TOML, the schema, the typed model, and
the caches of parsed documents, compiled indexes and command results."""
