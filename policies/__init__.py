"""The shipped, versioned policy files (package data)."""
